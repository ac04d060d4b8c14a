package sharegroup

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// The pipeline (docs/architecture.md, "Share-group source pipeline"): Poll
// emits one ready lane's batch per call and a full batch asks for a
// checkpoint; after a completion each lane ACCEPTs and
// polls again on its own goroutine, without the task calling Poll; a
// partial batch (no backlog) leaves the pace to the interval; and a Close
// right after a completion ACCEPTs what it covers instead of releasing it.
func TestLanesCycleOneBatchPerPollAndFinishOnTheirOwn(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", 600)
	var asked atomic.Int64
	s := openCounting(t, env, &asked, Lanes(3), withCfg(func(c *cfg) { c.stagger = 0 }))
	ctx := t.Context()
	seen := map[string]int{}
	poll := func() int {
		t.Helper()
		c := &sliceCollector{}
		if err := s.Poll(ctx, c); err != nil {
			t.Fatalf("Poll: %v", err)
		}
		for _, v := range c.vals {
			seen[v]++
		}
		return len(c.vals)
	}
	for deadline := time.Now().Add(30 * time.Second); len(seen) < 300 && time.Now().Before(deadline); {
		if n := poll(); n > 100 {
			t.Fatalf("one Poll emitted %d records; a lane's batch is at most 100", n)
		}
	}
	if len(seen) != 300 {
		t.Fatalf("three lanes emitted %d records, want 300", len(seen))
	}
	if _, err := s.Snapshot(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.NotifyCheckpointComplete(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// No Poll from here on: the lanes ACCEPT and fetch again themselves.
	for deadline := time.Now().Add(30 * time.Second); len(s.ready) < 3; {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 3 lanes polled again after checkpoint 1 completed, without the task polling", len(s.ready))
		}
		time.Sleep(10 * time.Millisecond)
	}
	before := asked.Load()
	if n := poll(); n != 100 {
		t.Fatalf("with three lanes ready one Poll emitted %d records, want one batch (100)", n)
	}
	if len(s.ready) != 2 {
		t.Fatalf("%d lanes still ready after one Poll, want 2", len(s.ready))
	}
	if asked.Load() == before {
		t.Fatal("an admitted batch did not ask for a checkpoint")
	}
	for range 2 {
		if n := poll(); n != 100 {
			t.Fatalf("Poll emitted %d records, want the next lane's batch (100)", n)
		}
	}
	for i := range 600 {
		if seen[strconv.Itoa(i)] != 1 {
			t.Fatalf("record %d emitted %d times", i, seen[strconv.Itoa(i)])
		}
	}
	if _, err := s.Snapshot(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := s.NotifyCheckpointComplete(ctx, 2); err != nil {
		t.Fatal(err)
	}
	// A partial batch means no backlog: the interval's checkpoint carries
	// it, as the job configured.
	produceN(t, env, "in", 10) // values 0-9 again
	asked.Store(0)
	late := 0
	for deadline := time.Now().Add(30 * time.Second); late < 10 && time.Now().Before(deadline); {
		late += poll()
	}
	if late != 10 {
		t.Fatalf("%d of ten records produced after checkpoint 2 were emitted", late)
	}
	if n := asked.Load(); n != 0 {
		t.Fatalf("%d checkpoint requests for a partial batch (no backlog, far from the cap)", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	tp := acklog.TopicPartition{Topic: "in", Partition: 0}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st := shareStart(t, env, "g", tp)
		if st == 600 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("share start offset %d after a Close right after checkpoint 2 completed, want 600 "+
				"(its records ACCEPTed, the ten uncommitted ones released)", st)
		}
	}
}

// Held batches that a checkpoint covers ask for no more checkpoints, even
// near the broker's per-partition cap: every notification wakes Poll, and
// asking again there would checkpoint in a loop.
func TestCoveredBatchesNearTheCapAskForNoMoreCheckpoints(t *testing.T) {
	// 300 held of a cap of 375 is past 80% of it.
	env := kafkatest.New(t, broker.Config("group.share.partition.max.record.locks", "375"))
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", 300)
	var asked atomic.Int64
	s := openCounting(t, env, &asked, BatchSize(300))
	ctx := t.Context()
	if got := pollFor(t, s, 300, 30*time.Second); len(got) != 300 {
		t.Fatalf("emitted %d records, want 300", len(got))
	}
	if asked.Load() == 0 {
		t.Fatal("a full batch near the cap did not ask for a checkpoint")
	}
	if _, err := s.Snapshot(ctx, 1); err != nil {
		t.Fatal(err)
	}
	asked.Store(0)
	for range 5 {
		if err := s.Poll(ctx, &sliceCollector{}); err != nil {
			t.Fatal(err)
		}
	}
	if n := asked.Load(); n != 0 {
		t.Fatalf("%d checkpoint requests while checkpoint 1 covers every held record", n)
	}
}

// A partial batch (the input went quiet) asks for a checkpoint once no
// batch has come for the idle-commit time, only with CommitWhenIdle, and
// asks no more once a checkpoint covers it; without the option the
// interval carries it, however long the source idles.
func TestCommitWhenIdleAsksForACheckpointOnceTheInputIsQuiet(t *testing.T) {
	const idle = 30 * time.Millisecond
	for _, tc := range []struct {
		name    string
		opts    []Opt
		wantAsk bool
	}{
		{"off by default", nil, false},
		{"CommitWhenIdle", []Opt{CommitWhenIdle(idle)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := kafkatest.New(t)
			env.CreateTopic(t, "in", 1, nil)
			produceN(t, env, "in", 10)
			var asked atomic.Int64
			// Two lanes: the second one polls, so not every lane holds a
			// batch (which would ask for a checkpoint by itself).
			s := openCounting(t, env, &asked, append([]Opt{BatchSize(100), Lanes(2), withCfg(func(c *cfg) { c.stagger = 0 })}, tc.opts...)...)
			ctx := t.Context()
			if got := pollFor(t, s, 10, 30*time.Second); len(got) != 10 {
				t.Fatalf("emitted %d records, want 10", len(got))
			}
			polls := 0
			for admitted := time.Now(); time.Since(admitted) < 4*idle; polls++ {
				if err := s.Poll(ctx, &sliceCollector{}); err != nil {
					t.Fatal(err)
				}
			}
			if got := asked.Load() > 0; got != tc.wantAsk {
				t.Fatalf("%d checkpoint requests after %v without a batch, want requests: %v", asked.Load(), 4*idle, tc.wantAsk)
			}
			// Once it asked, Poll waits for the barrier (the poll wait,
			// 50 ms, or an interrupt) instead of spinning.
			if polls > 20 {
				t.Fatalf("%d Polls in %v while idle: Poll spins", polls, 4*idle)
			}
			if _, err := s.Snapshot(ctx, 1); err != nil {
				t.Fatal(err)
			}
			asked.Store(0)
			for covered := time.Now(); time.Since(covered) < 4*idle; {
				if err := s.Poll(ctx, &sliceCollector{}); err != nil {
					t.Fatal(err)
				}
			}
			if n := asked.Load(); n != 0 {
				t.Fatalf("%d checkpoint requests while checkpoint 1 covers every held record", n)
			}
		})
	}
}

// openCounting opens the only subtask of a source the test drives by hand,
// counting its checkpoint requests in asked.
func openCounting(t *testing.T, env *kafkatest.Env, asked *atomic.Int64, opts ...Opt) *Source[string] {
	t.Helper()
	s := testSources(t, env, opts...)().(*Source[string])
	oc := &runtime.OperatorContext{Job: "job", Name: "src", UID: "src", Parallelism: 1, Logger: testLogger(t),
		RequestCheckpoint: func(string) { asked.Add(1) }}
	t.Cleanup(func() { s.Close() })
	if err := s.Open(t.Context(), oc); err != nil {
		t.Fatal(err)
	}
	return s
}

// A checkpoint's completion ACCEPTs its epoch even when the lanes'
// goroutines no longer run: a sibling stopped this subtask's fetching (the
// notification then finishes the lanes itself), or they ended between the
// notification and Close (Close ACCEPTs before it releases anything).
// Either way the records are done and none is released to be delivered
// again.
func TestACompletedEpochIsAcceptedWhenItsLanesNoLongerRun(t *testing.T) {
	tp := acklog.TopicPartition{Topic: "in", Partition: 0}
	for _, tc := range []struct {
		name     string
		complete func(t *testing.T, env *kafkatest.Env, s *Source[string])
	}{
		{"fetching stopped before the notification", func(t *testing.T, env *kafkatest.Env, s *Source[string]) {
			s.stopFetching()
			if err := s.NotifyCheckpointComplete(t.Context(), 1); err != nil {
				t.Fatal(err)
			}
			if st := shareStart(t, env, "g", tp); st != 100 {
				t.Fatalf("share start offset %d right after the notification, want 100", st)
			}
		}},
		{"lanes ended after the notification, before Close", func(t *testing.T, _ *kafkatest.Env, s *Source[string]) {
			// What NotifyCheckpointComplete does up to the poke, with the
			// lanes' goroutines already gone, so that only Close is left
			// to ACCEPT.
			s.stopFetching()
			if err := s.txn.Commit(t.Context(), 1); err != nil {
				t.Fatal(err)
			}
			s.completed.Note(1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := kafkatest.New(t)
			e.CreateTopic(t, "in", 1, nil)
			produceN(t, e, "in", 100)
			var asked atomic.Int64
			s := openCounting(t, e, &asked)
			if got := pollFor(t, s, 100, 30*time.Second); len(got) != 100 {
				t.Fatalf("emitted %d records, want 100", len(got))
			}
			if _, err := s.Snapshot(t.Context(), 1); err != nil {
				t.Fatal(err)
			}
			tc.complete(t, e, s)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if st := shareStart(t, e, "g", tp); st != 100 {
				t.Fatalf("share start offset %d after Close, want 100 (every record of completed checkpoint 1 ACCEPTed, none released)", st)
			}
		})
	}
}
