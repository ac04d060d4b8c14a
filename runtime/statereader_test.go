package runtime

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// stateCounter keeps, per key, a count (value state) and a count per
// parity of click id (map state).
type stateCounter struct {
	n      *ValueState[int64]
	parity *MapState[string, int64]
}

func (c *stateCounter) Open(_ context.Context, st *StateRegistry[string]) (err error) {
	if c.n, err = NewValueState[int64](st, "count", nil); err != nil {
		return err
	}
	c.parity, err = NewMapState[string, int64](st, "parity", nil, nil)
	return err
}

func (c *stateCounter) Process(_ string, v click, _ Collector[click]) error {
	n, _ := c.n.Value()
	c.n.Update(n + 1)
	p := [...]string{"even", "odd"}[v.ID%2]
	m, _ := c.parity.Get(p)
	c.parity.Put(p, m+1)
	return nil
}

// recordingSource records what it emitted.
type recordingSource struct {
	Source[click]
	mu   *sync.Mutex
	seen *[]click
}

type recordingCollector struct {
	Collector[click]
	s *recordingSource
}

func (c recordingCollector) Collect(v click) {
	c.s.mu.Lock()
	*c.s.seen = append(*c.s.seen, v)
	c.s.mu.Unlock()
	c.Collector.Collect(v)
}

func (s *recordingSource) Poll(ctx context.Context, out Collector[click]) error {
	return s.Source.Poll(ctx, recordingCollector{Collector: out, s: s})
}

// stateJob counts clicks per key in "counter" and keeps them in event-time
// session windows of an hour (none closes while the input lasts) in
// "sessions"; its one source subtask stalls after stallAt clicks.
func stateJob(cs []click, stall func(func() Source[click]) func() Source[click], rec *recordingSource) *Job {
	j := NewJob("state-read", DefaultParallelism(2), MaxParallelism(32))
	src := func() Source[click] {
		r := *rec
		r.Source = SliceSource(cs, 1)()
		return &r
	}
	events := FromSource(j, "clicks", stall(src), Parallelism(1),
		Watermarks(ForGenerator(func() WatermarkGenerator[click] { return &punctuatedWatermarks{bound: 20} },
			WithTimestampAssigner(func(c click, _ int64) int64 { return c.TS }))))
	byKey := func() *KeyedStream[string, click] { return KeyBy(events, func(c click) string { return c.Key }, nil) }
	counted := Process(byKey(), "counter", func() KeyedProcessFunction[string, click, click] { return &stateCounter{} })
	SinkTo(counted, "discard-counts", SinkFunc(func(context.Context, click) error { return nil }))
	sessions := Aggregate(Window(byKey(), EventTimeSessionWindows(time.Hour)), "sessions",
		AggregateFunction[click, sumAcc, sumAcc](clickSum{}), nil)
	SinkTo(sessions, "discard-sessions", SinkFunc(func(context.Context, sumAcc) error { return nil }))
	return j
}

// The keyed state of a job stopped mid-stream, read from its last
// checkpoint through the operators' codecs, holds for every key exactly
// the count, the per-parity counts, the session window (its bounds and
// accumulator) and the window's event-time timer computed from the input
// the source emitted; without the job graph every entry is still there,
// as bytes marked undecoded.
func TestKeyedStateReadFromACheckpointMatchesTheInputKeyByKey(t *testing.T) {
	cs := windowClicks(11, 3000, 20, false)
	store, err := checkpoint.OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var (
		mu   sync.Mutex
		seen []click
	)
	rec := &recordingSource{mu: &mu, seen: &seen}
	var stalled atomic.Int64
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	after := 0
	mc := NewMiniCluster(CheckpointStore(store), CheckpointInterval(5*time.Millisecond),
		OnCheckpointComplete(func(CheckpointEvent) {
			if stalled.Load() == 1 {
				if after++; after == 3 {
					cancel()
				}
			}
		}))
	stall := func(src func() Source[click]) func() Source[click] {
		return func() Source[click] { return &stallingSource[click]{Source: src(), stallAt: 1700, stalled: &stalled} }
	}
	if _, err := mc.Run(ctx, stateJob(cs, stall, rec)); !errors.Is(err, context.Canceled) {
		t.Fatalf("run: %v", err)
	}
	c, err := store.Latest(t.Context(), "state-read")
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	emitted := append([]click(nil), seen...)
	mu.Unlock()
	if len(emitted) != 1700 {
		t.Fatalf("the source emitted %d clicks, want 1700", len(emitted))
	}
	type session struct {
		w   TimeWindow
		acc sumAcc
	}
	wantCount, wantParity, wantSession := map[string]int64{}, map[string]int64{}, map[string]session{}
	for _, e := range emitted {
		wantCount[e.Key]++
		wantParity[e.Key+"/"+[...]string{"even", "odd"}[e.ID%2]]++
		s, ok := wantSession[e.Key]
		w := TimeWindow{Start: e.TS, End: e.TS + time.Hour.Milliseconds()}
		if ok {
			w = TimeWindow{Start: min(s.w.Start, w.Start), End: max(s.w.End, w.End)}
		}
		wantSession[e.Key] = session{w: w, acc: clickSum{}.Add(e, s.acc)}
	}

	blobs := func(uid string) map[int][]byte {
		out := map[int][]byte{}
		for _, ts := range c.Tasks {
			for _, op := range ts.Operators {
				if op.UID == uid {
					for kg, b := range op.KeyGroups {
						out[kg] = b
					}
				}
			}
		}
		return out
	}
	job := stateJob(cs, func(f func() Source[click]) func() Source[click] { return f }, rec)

	gotCount, gotParity := map[string]int64{}, map[string]int64{}
	err = ReadKeyedState(t.Context(), job, "counter", blobs("counter"), func(r StateRecord) error {
		key := r.Key.(string)
		if want := KeyGroupOf([]byte(key), 32); r.KeyGroup != want {
			t.Errorf("%s in key group %d, want %d", key, r.KeyGroup, want)
		}
		if r.Undecoded != "" {
			t.Errorf("undecoded %+v", r)
		}
		switch r.State {
		case "count":
			gotCount[key] = r.Value.(int64)
		case "parity":
			gotParity[key+"/"+r.MapKey.(string)] = r.Value.(int64)
		default:
			t.Errorf("state %q", r.State)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	compareMaps(t, "count", gotCount, wantCount)
	compareMaps(t, "parity", gotParity, wantParity)

	gotSession, gotTimer := map[string]session{}, map[string]int64{}
	err = ReadKeyedState(t.Context(), job, "sessions", blobs("sessions"), func(r StateRecord) error {
		key := r.Key.(string)
		switch {
		case r.State == windowState:
			gotSession[key] = session{w: r.Namespace.(TimeWindow), acc: r.Value.(sumAcc)}
		case r.State == "timers" && r.Timer != nil && r.Timer.Domain == "event-time" && r.Namespace == nil:
			gotTimer[key] = r.Timer.Timestamp
		default:
			t.Errorf("record %+v", r)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	compareMaps(t, "session", gotSession, wantSession)
	wantTimer := map[string]int64{}
	for k, s := range wantSession {
		wantTimer[k] = s.w.MaxTimestamp()
	}
	compareMaps(t, "timer", gotTimer, wantTimer)
	t.Logf("checkpoint %d: %d clicks, %d keys: counts, parities, sessions and timers equal the input's", c.ID, len(emitted), len(wantCount))

	// Without the job: every entry, keys and values as bytes.
	raw := map[string]int{}
	err = ReadKeyedState(t.Context(), nil, "counter", blobs("counter"), func(r StateRecord) error {
		if !strings.HasPrefix(r.Undecoded, "no codec") || r.Key != nil || r.KeyBase64 == nil || r.ValueBase64 == nil {
			t.Errorf("raw record %+v", r)
		}
		raw[r.State]++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if raw["count"] != len(wantCount) || raw["parity"] != len(wantCount) {
		t.Fatalf("raw records per state %v, want %d keys each", raw, len(wantCount))
	}

	// State sizes as inspection reports them add up to the blobs.
	for kg, b := range blobs("sessions") {
		parts, err := SplitKeyGroup(b)
		if err != nil {
			t.Fatal(err)
		}
		names := map[string]bool{}
		for _, p := range parts {
			names[p.Name] = true
		}
		if !names[windowState] || !names["timers"] {
			t.Fatalf("key group %d holds %v", kg, parts)
		}
	}

	err = ReadKeyedState(t.Context(), job, "nope", nil, func(StateRecord) error { return nil })
	if !errors.Is(err, ErrUnknownOperator) || !strings.Contains(err.Error(), "counter, ") {
		t.Fatalf("unknown uid: %v", err)
	}
	if err := ReadKeyedState(t.Context(), job, "clicks", nil, nil); !errors.Is(err, ErrNotKeyed) {
		t.Fatalf("source uid: %v", err)
	}
}

func compareMaps[V comparable](t *testing.T, what string, got, want map[string]V) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d keys, want %d", what, len(got), len(want))
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("%s of %q: %v (present %v), want %v", what, k, g, ok, w)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: unexpected key %q", what, k)
		}
	}
}
