package sharegroup

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// Issue 24, case 2: back-pressure must not burn renewed deliveries. These
// tests check, record by record, that a batch whose locks the source kept
// renewing while the task was blocked is emitted once, committed once and
// ACCEPTed, that no record is delivered twice, and that the broker archives
// nothing.

// waitLaneReady starts s's lanes and waits until lane 0 holds a batch it
// acquired and the task has not admitted yet; false if none came within.
func waitLaneReady(t *testing.T, s *Source[string], within time.Duration) bool {
	t.Helper()
	if err := s.startLanes(); err != nil {
		t.Fatal(err)
	}
	l := s.lanes[0]
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		l.mu.Lock()
		ready := l.state == laneReady
		l.mu.Unlock()
		if ready {
			return true
		}
	}
	return false
}

// The case as reported: 3 s locks, delivery limit 5, one lane, and a task
// that does not call Poll for 1.2 lock durations after its lane acquired a
// batch (downstream blocked it). The lane renews the batch's locks while it
// waits; the batch must be emitted (not released as stale by its original
// acquisition deadline), committed once, and ACCEPTed at delivery 1.
func TestBatchRenewedWhileTheTaskWasBlockedIsEmittedNotReleased(t *testing.T) {
	const lock, n = 3 * time.Second, 10
	env := kafkatest.New(t, append(lockBroker(lock), broker.Config("group.share.delivery.count.limit", "5"))...)
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", n)
	dl := newDeliveryLog()
	s := openSource(t, env, 0, nil, Lanes(1), dl.opt())
	c := &sliceCollector{}
	ctx := t.Context()
	id := checkpoint.ID(1)
	for round := 1; round <= 7 && shareStart(t, env, "g", in0) < n; round++ {
		if !waitLaneReady(t, s, 10*time.Second) {
			break // nothing left to acquire: done, or archived
		}
		time.Sleep(lock * 6 / 5) // the task is blocked downstream: Poll is not called
		// One Poll admits the ready batch; then the task blocks again.
		if err := s.Poll(ctx, c); err != nil {
			t.Fatalf("round %d: Poll: %v (records emitted so far: %d of %d; acquisitions by delivery count: %v)",
				round, err, len(c.vals), n, dl.perCount)
		}
		if _, err := s.Snapshot(ctx, id); err != nil {
			t.Fatalf("round %d: Snapshot(%d): %v", round, id, err)
		}
		notifyComplete(t, s, id)
		id++
	}
	dl.mu.Lock()
	most, perCount := dl.most["in"], dl.perCount
	dl.mu.Unlock()
	if d := exactlyOnce(counts(t, c.vals), n); d != "" {
		t.Fatalf("emitted %d of %d records: %s; acquisitions by delivery count: %v (a renewed batch was released "+
			"unprocessed each time it waited behind the blocked task)", len(c.vals), n, d, perCount)
	}
	checkEveryRecordOnce(t, env, c.vals, n, "the source")
	if most != 1 {
		t.Errorf("a record was acquired at delivery %d, want every record delivered once (acquisitions by delivery count: %v)",
			most, perCount)
	}
}

// blockingSink is the sink of TestBackPressuredJobWithDefaultsEmitsEveryRecordOnce:
// it counts every value and, once the count reaches each of at, blocks for
// hold in its next Write, or (inSnapshot, a slow pre-commit) in its next
// Snapshot: a downstream stuck far longer than the lock. Every subtask
// shares it.
type blockingSink struct {
	mu         sync.Mutex
	seen       map[int]int
	total      int
	at         []int // ascending
	inSnapshot bool
	hold       time.Duration
	held       atomic.Int32
}

// due reports whether the sink blocks now. b.mu is held.
func (b *blockingSink) due() bool {
	if len(b.at) == 0 || b.total < b.at[0] {
		return false
	}
	b.at = b.at[1:]
	return true
}

func (b *blockingSink) block(ctx context.Context) error {
	b.held.Add(1)
	select {
	case <-time.After(b.hold):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Open implements runtime.Sink.
func (b *blockingSink) Open(context.Context, *runtime.OperatorContext) error { return nil }

// Write implements runtime.Sink.
func (b *blockingSink) Write(ctx context.Context, v string) error {
	i, err := strconv.Atoi(v)
	if err != nil {
		return fmt.Errorf("value %q is not a produce index", v)
	}
	b.mu.Lock()
	b.seen[i]++
	b.total++
	block := !b.inSnapshot && b.due()
	b.mu.Unlock()
	if block {
		return b.block(ctx)
	}
	return nil
}

// Snapshot implements runtime.Sink.
func (b *blockingSink) Snapshot(ctx context.Context, _ checkpoint.ID) (runtime.OperatorState, error) {
	b.mu.Lock()
	block := b.inSnapshot && b.due()
	b.mu.Unlock()
	if block {
		return runtime.OperatorState{}, b.block(ctx)
	}
	return runtime.OperatorState{}, nil
}

// Close implements runtime.Sink.
func (b *blockingSink) Close() error { return nil }

func (b *blockingSink) count() (map[int]int, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[int]int, len(b.seen))
	for k, v := range b.seen {
		out[k] = v
	}
	return out, b.total
}

// What users get by default (several lanes per subtask, renewals on, the
// broker's default delivery limit 5), under a back-pressured downstream:
// a sink that blocks two lock durations at a time, three times, while the
// input keeps arriving: chained to the source (the source task itself
// stops), behind a channel of one record (the source blocks on the full
// channel), or chained with a slow pre-commit (a slow checkpoint: the sink
// blocks in Snapshot instead of Write). Every record must reach
// the sink exactly once (no rollback, no loss), be in exactly one committed
// marker and ACCEPTed; the source must release nothing for its lock's time
// left (no delivery burnt), nothing may be re-queued or dead-lettered, no
// restart.
func TestBackPressuredJobWithDefaultsEmitsEveryRecordOnce(t *testing.T) {
	for _, tc := range []struct {
		name        string
		sinkPar     int
		inSnapshot  bool
		clusterOpts []runtime.ClusterOpt
	}{
		{name: "sink chained to the source", sinkPar: 2},
		{name: "sink behind a full channel", sinkPar: 1,
			clusterOpts: []runtime.ClusterOpt{runtime.BatchSize(1), runtime.ChannelCapacity(1)}},
		{name: "slow pre-commit of a chained sink", sinkPar: 2, inSnapshot: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A 4 s lock leaves the source's own-clock margin (a quarter)
			// at 1 s: on a machine loaded far beyond its cores (-race
			// beside compilers), a lane's renewal can be starved for over
			// a second, and a lapse costs a release or a restart, which
			// this test forbids. With 2 s locks it failed once in CI and
			// in most runs at load 14-27 (three runs at once beside
			// builds); with 3 s, in 2 of 8 runs at load 20-22, none of 42
			// at 5-14. The failure message shows every redelivered
			// record's acquisitions.
			const lock, parts, perPart = 4 * time.Second, 8, 40
			const total = parts * perPart
			env := kafkatest.New(t, lockBroker(lock)...)
			env.CreateTopic(t, "in", parts, nil)
			dl := newDeliveryLog()
			newSrc, err := New(func(r *kgo.Record) (string, error) { return string(r.Value), nil },
				Brokers(env.Addr), Topics("in"), Group("g"), Logger(testLogger(t)), dl.opt(),
				// checkCoveredOnce reads every marker: none may be
				// tombstoned before it does, however slow the run.
				MarkerGrace(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			sink := &blockingSink{seen: map[int]int{}, at: []int{1, total / 3, 2 * total / 3}, inSnapshot: tc.inSnapshot,
				hold: 2 * lock}
			var mu sync.Mutex
			var subtasks []*Source[string]
			j := runtime.NewJob("backpressure")
			src := runtime.FromSource(j, "src", func() runtime.Source[string] {
				s := newSrc()
				mu.Lock()
				subtasks = append(subtasks, s.(*Source[string]))
				mu.Unlock()
				return s
			}, runtime.Parallelism(2))
			runtime.SinkTo(src, "sink", func() runtime.Sink[string] { return sink }, runtime.Parallelism(tc.sinkPar))
			var restarts atomic.Int32
			var lastRestart atomic.Value
			opts := append([]runtime.ClusterOpt{runtime.CheckpointInterval(200 * time.Millisecond),
				runtime.CheckpointTimeout(time.Minute), runtime.Logger(testLogger(t)),
				runtime.OnRestart(func(_ int, err error) { restarts.Add(1); lastRestart.Store(fmt.Sprint(err)) })},
				tc.clusterOpts...)
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() {
				_, err := runtime.NewMiniCluster(opts...).Run(ctx, j)
				done <- err
			}()
			// The input arrives while the job runs, in waves of one
			// record per partition every 150 ms, so idle lanes acquire
			// batches while the sink blocks.
			cl := env.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
			for i := range perPart {
				var recs []*kgo.Record
				for p := range int32(parts) {
					recs = append(recs, &kgo.Record{Topic: "in", Partition: p, Value: []byte(strconv.Itoa(int(p)*perPart + i))})
				}
				if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
					cancel()
					<-done
					t.Fatal(err)
				}
				time.Sleep(150 * time.Millisecond)
			}
			accepted := func() bool {
				for p := range int32(parts) {
					if shareStart(t, env, "g", acklog.TopicPartition{Topic: "in", Partition: p}) < perPart {
						return false
					}
				}
				return true
			}
			deadline := time.Now().Add(90 * time.Second)
			for {
				_, seen := sink.count()
				if seen >= total && accepted() {
					break
				}
				if time.Now().After(deadline) {
					cancel()
					<-done
					t.Fatalf("after 90 s the sink saw %d of %d records (restarts %d, last cause %v); acquisitions by delivery "+
						"count: %v", seen, total, restarts.Load(), lastRestart.Load(), dl.perCount)
				}
				select {
				case err := <-done:
					cancel()
					t.Fatalf("the job ended: %v (sink saw %d of %d; acquisitions by delivery count: %v)", err, seen, total,
						dl.perCount)
				case <-time.After(200 * time.Millisecond):
				}
			}
			cancel()
			<-done
			got, _ := sink.count()
			if d := exactlyOnce(got, total); d != "" {
				t.Errorf("the sink saw: %s", d)
			}
			checkCoveredOnce(t, env, parts, perPart)
			if dlq := env.ReadCommitted(t, "g-dlq"); len(dlq) != 0 {
				t.Errorf("%d records dead-lettered, want none", len(dlq))
			}
			if r := env.ReadCommitted(t, "g-retry"); len(r) != 0 {
				t.Errorf("%d records re-queued, want none (no record should get near the delivery limit)", len(r))
			}
			if n := restarts.Load(); n != 0 {
				dl.mu.Lock()
				t.Errorf("the job restarted %d times (last cause: %v), want none; records acquired more than once: %v", n,
					lastRestart.Load(), dl.redelivered(20))
				dl.mu.Unlock()
			}
			if sink.held.Load() < 3 {
				t.Errorf("setup: the sink blocked %d times, want 3", sink.held.Load())
			}
			// The source burnt no delivery: it released nothing it had
			// renewed, and (no restart, no decline) let no lock lapse. A
			// record may still be acquired twice by kgo's one fetch after a
			// poll (see inFlight): it sits in the client's buffer, unseen
			// and unrenewed, while its lane holds its batch, and its lock
			// lapses; the re-queue margin covers that one unseen delivery.
			var released int64
			mu.Lock()
			for _, s := range subtasks {
				released += s.counters.nearExpiry.Load()
			}
			mu.Unlock()
			if released != 0 {
				t.Errorf("%d records were released unprocessed for their lock's time left, want none (acquisitions by delivery "+
					"count: %v)", released, dl.perCount)
			}
			dl.mu.Lock()
			defer dl.mu.Unlock()
			if dl.most["in"] > 2 {
				t.Errorf("a record was acquired at delivery %d, want at most 2 (acquisitions by delivery count: %v): %v",
					dl.most["in"], dl.perCount, dl.redelivered(20))
			}
			t.Logf("acquisitions by delivery count: %v", dl.perCount)
		})
	}
}
