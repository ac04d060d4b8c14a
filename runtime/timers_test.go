package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// click is an out-of-order event of the timer tests.
type click struct {
	Key string
	TS  int64
	ID  int
}

// clicks are n events over keys keys, out of order by less than 400 ms in
// each source subtask's stream (SliceSource deals item i to subtask i%p).
func clicks(n, keys int) []click {
	out := make([]click, n)
	for i := range out {
		out[i] = click{Key: fmt.Sprintf("k%02d", i%keys), TS: 1_000_000 + int64(i)*5 - int64(i*7919%400), ID: i}
	}
	return out
}

// sortedByKey is what an event-time sort must emit per key: the ids in
// timestamp order (ties by id).
func sortedByKey(cs []click) map[string][]int64 {
	byKey := map[string][]click{}
	for _, c := range cs {
		byKey[c.Key] = append(byKey[c.Key], c)
	}
	want := map[string][]int64{}
	for k, cs := range byKey {
		slices.SortFunc(cs, func(a, b click) int {
			if a.TS != b.TS {
				return int(a.TS - b.TS)
			}
			return a.ID - b.ID
		})
		for _, c := range cs {
			want[k] = append(want[k], int64(c.ID))
		}
	}
	return want
}

// eventTimeSorter buffers each key's events until the watermark passes
// their timestamp (an event-time timer per key and timestamp), then emits
// them in timestamp order: its output per key is the sorted input. A late
// event (at or below the watermark) is emitted at once with a negative id,
// which the tests count as a failure.
type eventTimeSorter struct {
	pending *MapState[int64, []int]
}

func (s *eventTimeSorter) Open(_ context.Context, st *StateRegistry[string]) error {
	var err error
	s.pending, err = NewMapState[int64, []int](st, "pending", nil, nil)
	return err
}

func (s *eventTimeSorter) ProcessElement(ctx *KeyedContext[string], c click, out Collector[seqRec]) error {
	if ctx.Timestamp() != c.TS {
		return fmt.Errorf("record %d: context timestamp %d, want %d", c.ID, ctx.Timestamp(), c.TS)
	}
	if c.TS <= ctx.CurrentWatermark() {
		out.Collect(seqRec{Key: c.Key, Seq: -int64(c.ID) - 1})
		return nil
	}
	ids, _ := s.pending.Get(c.TS)
	s.pending.Put(c.TS, append(slices.Clone(ids), c.ID))
	ctx.TimerService().RegisterEventTimeTimer(c.TS)
	return nil
}

func (s *eventTimeSorter) OnTimer(ctx *KeyedContext[string], ts int64, out Collector[seqRec]) error {
	if ctx.TimeDomain() != EventTime || ctx.Timestamp() != ts {
		return fmt.Errorf("timer %d: domain %s, timestamp %d", ts, ctx.TimeDomain(), ctx.Timestamp())
	}
	ids, ok := s.pending.Get(ts)
	if !ok {
		return fmt.Errorf("key %s: timer %d without events", ctx.Key(), ts)
	}
	slices.Sort(ids)
	for _, id := range ids {
		out.Collect(seqRec{Key: ctx.Key(), Seq: int64(id)})
	}
	s.pending.Delete(ts)
	return nil
}

// sortJob sorts cs by event time per key into txns.
func sortJob(cs []click, srcPar, par int, txns *memTxns, wrap func(func() Source[click]) func() Source[click], opts ...JobOpt) *Job {
	j := NewJob("sort", append([]JobOpt{DefaultParallelism(par), MaxParallelism(32)}, opts...)...)
	src := SliceSource(cs, 1)
	if wrap != nil {
		src = wrap(src)
	}
	ws := ForBoundedOutOfOrderness[click](500*time.Millisecond,
		WithTimestampAssigner(func(c click, _ int64) int64 { return c.TS }),
		WithWatermarkInterval(2*time.Millisecond))
	events := FromSource(j, "clicks", src, Parallelism(srcPar), Watermarks(ws))
	sorted := ProcessKeyed(KeyBy(events, func(c click) string { return c.Key }, nil), "sort",
		func() KeyedProcessor[string, click, seqRec] { return &eventTimeSorter{} })
	SinkTo(sorted, "sink", func() Sink[seqRec] { return &txnSink{txns: txns} })
	return j
}

// checkSorted compares the committed output to the sorted input, record by
// record: per key the same ids in the same order, none late.
func checkSorted(t *testing.T, out []seqRec, want map[string][]int64) {
	t.Helper()
	got := map[string][]int64{}
	for _, r := range out {
		if r.Seq < 0 {
			t.Errorf("event %d of %s arrived late", -r.Seq-1, r.Key)
			continue
		}
		got[r.Key] = append(got[r.Key], r.Seq)
	}
	for k, w := range want {
		if !slices.Equal(got[k], w) {
			t.Errorf("key %s: got %d events %v..., want %d in event-time order %v...", k, len(got[k]), firstIDs(got[k]), len(w), firstIDs(w))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected key %s", k)
		}
	}
}

func firstIDs(s []int64) []int64 { return s[:min(len(s), 8)] }

// Out-of-order events sorted by event-time timers: every event once, per
// key in timestamp order, the watermark (bounded out-of-orderness, the
// minimum over the source subtasks, the final watermark at the end) firing
// each timer after every event it waits for; in process and across an
// Exchange.
func TestEventTimeTimersFireInTimestampOrderOverOutOfOrderInput(t *testing.T) {
	cs := clicks(3000, 17)
	want := sortedByKey(cs)
	for _, tc := range []struct {
		name        string
		srcPar, par int
		split       bool
	}{{"one-subtask", 1, 1, false}, {"parallel", 2, 3, false}, {"across-an-exchange", 2, 3, true}} {
		t.Run(tc.name, func(t *testing.T) {
			txns := newMemTxns()
			j := sortJob(cs, tc.srcPar, tc.par, txns, nil)
			opts := []ClusterOpt{CheckpointInterval(10 * time.Millisecond)}
			if tc.split {
				opts = append(opts, Deployment(splitDeployer{job: j, parts: 2, sent: new(atomic.Int64)}))
			}
			if _, err := NewMiniCluster(opts...).Run(t.Context(), j); err != nil {
				t.Fatal(err)
			}
			checkSorted(t, txns.output(), want)
		})
	}
}

// stallingSource stops emitting after stallAt records (an idle, endless
// source) until resume is closed.
type stallingSource[T any] struct {
	Source[T]
	stallAt int
	emitted int
	stalled *atomic.Int64
	noted   bool
}

type countingCollector[T any] struct {
	Collector[T]
	n *int
}

func (c countingCollector[T]) Collect(v T) { *c.n++; c.Collector.Collect(v) }

func (s *stallingSource[T]) Poll(ctx context.Context, out Collector[T]) error {
	if s.emitted >= s.stallAt {
		if !s.noted {
			s.noted = true
			s.stalled.Add(1)
		}
		time.Sleep(time.Millisecond)
		return nil
	}
	return s.Source.Poll(ctx, countingCollector[T]{Collector: out, n: &s.emitted})
}

// Timers are keyed state: a run stopped mid-way (timers pending in its
// last checkpoint) and resumed at another parallelism of the keyed
// operator emits exactly what a run without failure emits, record by record.
func TestEventTimeTimersRestoredAtAnotherParallelismEqualARunWithoutFailure(t *testing.T) {
	cs := clicks(2000, 23)
	want := sortedByKey(cs)
	ref := newMemTxns()
	if _, err := NewMiniCluster(CheckpointInterval(10*time.Millisecond)).Run(t.Context(), sortJob(cs, 2, 2, ref, nil)); err != nil {
		t.Fatal(err)
	}
	checkSorted(t, ref.output(), want)
	for _, tc := range []struct{ from, to int }{{2, 3}, {3, 1}, {1, 4}} {
		t.Run(fmt.Sprintf("%d->%d", tc.from, tc.to), func(t *testing.T) {
			store, err := checkpoint.OpenStore(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			txns := newMemTxns()
			stopMidStream(t, store, len(cs)/4, func(stall stallFn) *Job { return sortJob(cs, 2, tc.from, txns, stall) })
			before := len(txns.output())
			if before == 0 || before >= len(cs)/2 {
				t.Fatalf("first run committed %d of %d records: want a run stopped mid-way", before, len(cs))
			}
			mc := NewMiniCluster(CheckpointStore(store), CheckpointInterval(5*time.Millisecond))
			if _, err := mc.Run(t.Context(), sortJob(cs, 2, tc.to, txns, nil)); err != nil {
				t.Fatal(err)
			}
			checkSorted(t, txns.output(), want)
			if !slices.Equal(perKey(txns.output()), perKey(ref.output())) {
				t.Error("the restored run's output differs from the run without failure")
			}
		})
	}
}

// perKey lists the records grouped by key, keys sorted, each key's records
// in output order.
func perKey(out []seqRec) []string {
	by := map[string][]string{}
	for _, r := range out {
		by[r.Key] = append(by[r.Key], fmt.Sprint(r.Seq))
	}
	var keys []string
	for k := range by {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var flat []string
	for _, k := range keys {
		flat = append(flat, k)
		flat = append(flat, by[k]...)
	}
	return flat
}

// reminder registers, per key, one processing-time timer at deadline and
// emits the key when it fires.
type reminder struct {
	deadline   int64
	registered *atomic.Int64
	fired      *atomic.Int64
	seen       *ValueState[bool]
}

func (r *reminder) Open(_ context.Context, st *StateRegistry[string]) error {
	var err error
	r.seen, err = NewValueState[bool](st, "seen", nil)
	return err
}

func (r *reminder) ProcessElement(ctx *KeyedContext[string], _ seqRec, _ Collector[seqRec]) error {
	if _, ok := r.seen.Value(); ok {
		return nil
	}
	r.seen.Update(true)
	ctx.TimerService().RegisterProcessingTimeTimer(r.deadline)
	ctx.TimerService().RegisterProcessingTimeTimer(r.deadline) // one timer per key and timestamp
	r.registered.Add(1)
	return nil
}

func (r *reminder) OnTimer(ctx *KeyedContext[string], ts int64, out Collector[seqRec]) error {
	if ctx.TimeDomain() != ProcessingTime || ts != r.deadline {
		return fmt.Errorf("timer %d in %s, want processing time %d", ts, ctx.TimeDomain(), r.deadline)
	}
	r.fired.Add(1)
	out.Collect(seqRec{Key: ctx.Key(), Seq: ts})
	return nil
}

// A processing-time timer that came due while the job was down fires right
// after the restore, once per key, with nothing else to trigger it (the
// source is idle).
func TestProcessingTimeTimerDueDuringDowntimeFiresAfterRestore(t *testing.T) {
	const keys = 6
	store, err := checkpoint.OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	deadline := time.Now().Add(5 * time.Second).UnixMilli()
	txns := newMemTxns()
	job := func(fired, registered *atomic.Int64, par int) *Job {
		j := NewJob("remind", DefaultParallelism(par), MaxParallelism(16))
		src := FromSource(j, "source", seqSourceOf(seqSource{keys: keys, splits: 2, n: 5, perPoll: 1, stallAt: 1, pollDelay: time.Millisecond}), Parallelism(2))
		out := ProcessKeyed(KeyBy(src, func(r seqRec) string { return r.Key }, nil), "remind",
			func() KeyedProcessor[string, seqRec, seqRec] {
				return &reminder{deadline: deadline, registered: registered, fired: fired}
			})
		SinkTo(out, "sink", func() Sink[seqRec] { return &txnSink{txns: txns} })
		return j
	}
	// Run 1: every key registers its timer; stop after checkpoints that
	// hold them, before the deadline.
	var fired1, registered1 atomic.Int64
	ctx, cancel := context.WithCancel(t.Context())
	var after int
	mc := NewMiniCluster(CheckpointStore(store), CheckpointInterval(5*time.Millisecond),
		OnCheckpointComplete(func(CheckpointEvent) {
			if registered1.Load() == keys {
				if after++; after == 3 {
					cancel()
				}
			}
		}))
	if _, err := mc.Run(ctx, job(&fired1, &registered1, 2)); !errors.Is(err, context.Canceled) {
		t.Fatalf("run 1: %v", err)
	}
	cancel()
	if fired1.Load() != 0 {
		t.Fatalf("run 1 fired %d timers: it ran past the deadline (machine too slow for a 5 s margin)", fired1.Load())
	}
	// The job is down past the deadline.
	time.Sleep(time.Until(time.UnixMilli(deadline + 1)))
	// Run 2, at another parallelism: the timers fire after the restore.
	var fired2, registered2 atomic.Int64
	ctx, cancel = context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	mc = NewMiniCluster(CheckpointStore(store), CheckpointInterval(5*time.Millisecond),
		OnCheckpointComplete(func(CheckpointEvent) {
			if len(txns.output()) >= keys {
				cancel()
			}
		}))
	if _, err := mc.Run(ctx, job(&fired2, &registered2, 3)); !errors.Is(err, context.Canceled) {
		t.Errorf("run 2 (stopped once every key's timer output committed): %v", err)
	}
	if registered2.Load() != 0 {
		t.Errorf("run 2 registered %d timers: the source should be idle", registered2.Load())
	}
	got := map[string]int{}
	for _, r := range txns.output() {
		got[r.Key]++
		if r.Seq != deadline {
			t.Errorf("key %s: timer %d, want %d", r.Key, r.Seq, deadline)
		}
	}
	for k := range keys {
		if key := fmt.Sprintf("k%03d", k); got[key] != 1 {
			t.Errorf("key %s: timer fired %d times after the restore, want 1", key, got[key])
		}
	}
}

// stallFn wraps a job's sources so that each stalls after stallAt records.
type stallFn = func(func() Source[click]) func() Source[click]

// stopMidStream runs the job that build makes (its sources wrapped by the
// stallFn it is given) on store until two sources stalled and three more
// checkpoints completed, then cancels it: the job stops mid-stream with a
// checkpoint to restore from.
func stopMidStream(t *testing.T, store *checkpoint.Store, stallAt int, build func(stallFn) *Job, opts ...ClusterOpt) {
	t.Helper()
	stopMidStreamOf(t, store, 2, stallAt, build, opts...)
}

// stopMidStreamOf is stopMidStream for a job whose sources have subtasks
// subtasks in all.
func stopMidStreamOf(t *testing.T, store *checkpoint.Store, subtasks int64, stallAt int, build func(stallFn) *Job, opts ...ClusterOpt) {
	t.Helper()
	var stalled atomic.Int64
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var after int
	mc := NewMiniCluster(append([]ClusterOpt{CheckpointStore(store), CheckpointInterval(5 * time.Millisecond),
		OnCheckpointComplete(func(CheckpointEvent) {
			if stalled.Load() == subtasks {
				if after++; after == 3 {
					cancel()
				}
			}
		})}, opts...)...)
	stall := func(src func() Source[click]) func() Source[click] {
		return func() Source[click] {
			return &stallingSource[click]{Source: src(), stallAt: stallAt, stalled: &stalled}
		}
	}
	if _, err := mc.Run(ctx, build(stall)); !errors.Is(err, context.Canceled) {
		t.Fatalf("first run: %v", err)
	}
}
