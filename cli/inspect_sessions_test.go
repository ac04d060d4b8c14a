package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
	weirruntime "github.com/weirstream/weir/runtime"
)

// sessClick is a click of the sessions-like test job.
type sessClick struct {
	User string `json:"user"`
	TS   int64  `json:"ts"`
}

// heldSource emits its records in one poll, calls emitted, then emits
// nothing, without ending: a job whose state holds every record.
type heldSource[T any] struct {
	recs    []T
	emitted func()
	done    bool
}

func (s *heldSource[T]) Open(context.Context, *weirruntime.OperatorContext) error { return nil }
func (s *heldSource[T]) Poll(ctx context.Context, out weirruntime.Collector[T]) error {
	if !s.done {
		for _, r := range s.recs {
			out.Collect(r)
		}
		s.done = true
		s.emitted()
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Millisecond):
	}
	return nil
}
func (s *heldSource[T]) Snapshot(context.Context, checkpoint.ID) (weirruntime.OperatorState, error) {
	return weirruntime.OperatorState{}, nil
}
func (s *heldSource[T]) Close() error { return nil }

type clickCount struct{}

func (clickCount) CreateAccumulator() int64       { return 0 }
func (clickCount) Add(_ sessClick, n int64) int64 { return n + 1 }
func (clickCount) GetResult(n int64) int64        { return n }
func (clickCount) Merge(a, b int64) int64         { return a + b }

// sessionsJob keeps clicks in event-time session windows of an hour per
// user (none closes: the clicks span seconds).
func sessionsJob(clicks []sessClick, emitted *atomic.Bool) *weirruntime.Job {
	j := weirruntime.NewJob("test-sessions", weirruntime.DefaultParallelism(2), weirruntime.MaxParallelism(16))
	src := weirruntime.FromSource(j, "clicks", func() weirruntime.Source[sessClick] {
		return &heldSource[sessClick]{recs: clicks, emitted: func() { emitted.Store(true) }}
	},
		weirruntime.Parallelism(1), weirruntime.Watermarks(weirruntime.ForBoundedOutOfOrderness[sessClick](time.Second,
			weirruntime.WithTimestampAssigner(func(c sessClick, _ int64) int64 { return c.TS }))))
	byUser := weirruntime.KeyBy(src, func(c sessClick) string { return c.User }, nil)
	out := weirruntime.Aggregate(weirruntime.Window(byUser, weirruntime.EventTimeSessionWindows(time.Hour)), "sessions",
		weirruntime.AggregateFunction[sessClick, int64, int64](clickCount{}), nil)
	weirruntime.SinkTo(out, "discard", weirruntime.SinkFunc(func(context.Context, int64) error { return nil }))
	return j
}

// checkpointOfHeldJob runs job (named name, its sources heldSources) on
// the mini cluster until emitted says its sources emitted everything and
// three more checkpoints completed, and returns its latest checkpoint.
func checkpointOfHeldJob(t *testing.T, name string, job *weirruntime.Job, emitted func() bool) checkpoint.Completed {
	t.Helper()
	store, err := checkpoint.OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	after := 0
	mc := weirruntime.NewMiniCluster(weirruntime.CheckpointStore(store), weirruntime.CheckpointInterval(10*time.Millisecond),
		weirruntime.OnCheckpointComplete(func(weirruntime.CheckpointEvent) {
			if emitted() {
				if after++; after == 3 {
					cancel()
				}
			}
		}))
	if _, err := mc.Run(ctx, job); !errors.Is(err, context.Canceled) {
		t.Fatalf("run: %v", err)
	}
	c, err := store.Latest(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A sessions-like job (event-time session windows, their timers) stopped
// with every click in open sessions: state dump of its savepoint prints,
// for every user, the session window (bounds as JSON) with the number of
// its clicks, and the window's event-time timer, all equal to what the
// input gives.
func TestDumpOfSessionWindowsGivesEveryUsersWindowCountAndTimer(t *testing.T) {
	var clicks []sessClick
	for i := range 600 {
		clicks = append(clicks, sessClick{User: fmt.Sprintf("u%02d", i%13), TS: 1_000_000 + int64(i*7919%5000)})
	}
	type session struct{ start, end, n int64 }
	want := map[string]session{}
	for _, c := range clicks {
		s, ok := want[c.User]
		if !ok {
			s = session{start: c.TS, end: c.TS + time.Hour.Milliseconds()}
		}
		s.start, s.end, s.n = min(s.start, c.TS), max(s.end, c.TS+time.Hour.Milliseconds()), s.n+1
		want[c.User] = s
	}

	var emitted atomic.Bool
	c := checkpointOfHeldJob(t, "test-sessions", sessionsJob(clicks, &emitted), emitted.Load)
	sp := filepath.Join(t.TempDir(), "sp")
	if err := checkpoint.WriteSavepoint(t.Context(), sp, c, time.Now(), checkpoint.WithJob("test-sessions", nil)); err != nil {
		t.Fatal(err)
	}

	reg := weirruntime.NewRegistry()
	if err := reg.Register(weirruntime.JobType{Name: "test-sessions", Build: func(weirruntime.Params) (*weirruntime.Job, error) {
		return sessionsJob(nil, new(atomic.Bool)), nil
	}}); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	root := newRootCmd(reg, &out, &errOut)
	root.SetArgs([]string{"state", "dump", sp, "--operator", "sessions"})
	if err := root.ExecuteContext(t.Context()); err != nil {
		t.Fatalf("dump: %v\n%s", err, errOut.String())
	}
	gotWindow, gotTimer := map[string]session{}, map[string]int64{}
	for _, l := range bytes.Split(bytes.TrimSpace(out.Bytes()), []byte("\n")) {
		var r struct {
			State     string `json:"state"`
			Key       string `json:"key"`
			Namespace *struct {
				Start int64 `json:"start"`
				End   int64 `json:"end"`
			} `json:"namespace"`
			Value     *int64 `json:"value"`
			Undecoded string `json:"undecoded"`
			Timer     *struct {
				Domain    string `json:"domain"`
				Timestamp int64  `json:"timestamp"`
			} `json:"timer"`
		}
		if err := json.Unmarshal(l, &r); err != nil {
			t.Fatalf("line %s: %v", l, err)
		}
		switch {
		case r.Undecoded != "":
			t.Fatalf("undecoded line %s", l)
		case r.State == "window-contents" && r.Namespace != nil && r.Value != nil:
			if _, dup := gotWindow[r.Key]; dup {
				t.Fatalf("two windows of %s: the test wants one session per user", r.Key)
			}
			gotWindow[r.Key] = session{start: r.Namespace.Start, end: r.Namespace.End, n: *r.Value}
		case r.State == "timers" && r.Timer != nil && r.Timer.Domain == "event-time" && r.Namespace == nil:
			gotTimer[r.Key] = r.Timer.Timestamp
		default:
			t.Fatalf("line %s", l)
		}
	}
	if len(gotWindow) != len(want) || len(gotTimer) != len(want) {
		t.Errorf("%d windows and %d timers, want %d of each", len(gotWindow), len(gotTimer), len(want))
	}
	for u, s := range want {
		if gotWindow[u] != s {
			t.Errorf("%s: window %+v, the input gives %+v", u, gotWindow[u], s)
		}
		if gotTimer[u] != s.end-1 {
			t.Errorf("%s: timer at %d, want %d (the window's last millisecond)", u, gotTimer[u], s.end-1)
		}
	}
	t.Logf("checkpoint %d: %d users' sessions and timers equal the input's %d clicks", c.ID, len(want), len(clicks))
}
