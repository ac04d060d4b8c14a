package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sinks/kafka"
	"github.com/weirstream/weir/sources/sharegroup"
)

// A job cancelled for good at any moment of its life ends with its latest
// completed checkpoint committed, everything later aborted and no share
// record held: no transaction is left open (the output's and the
// ack-log's last stable offsets reach their high watermarks), the output
// read_committed right after the cancel is exactly, record by record, what
// the completed checkpoints cover, and a new job on the same share group
// gets every other input record at once (locks last 10 minutes here, so a
// record the cancelled job held would never come) and adds each exactly
// once. The attempts that fail do so after checkpoint 3 was persisted and
// before any task was notified (jm.after-checkpoint-persisted), so only a
// recovery commits it.
func TestCancelAtAnyMomentCommitsTheLastCompletedCheckpointAndLeavesNothingOpen(t *testing.T) {
	tests := []struct {
		name string
		// fail makes the first attempt fail after a checkpoint that covers
		// some output was persisted, before any task was notified.
		fail bool
		// delay before a restart.
		delay time.Duration
		// moment arranges the cancel (nil: cancelAtFailure does): it returns
		// options of the first Run, given the function that cancels the job
		// and what the sink took into checkpoints so far.
		moment func(cancel func(), job func() *runtime.Job, covered func() int) []runtime.ClusterOpt
		// cancelAtFailure cancels the job as the attempt fails: its tasks
		// are being cancelled for a restart.
		cancelAtFailure bool
		// slowCoordinator keeps the failing coordinator from stopping (it
		// waits in the failpoint) until a sink was told the job is
		// cancelled or closed: the cancel's wait for the coordinator
		// expires while the checkpoint just persisted was notified to none
		// of the tasks.
		slowCoordinator bool
		// save cancels the job while the store saves the checkpoint that
		// covers enough output, waits (until stop) and then finishes the
		// save, which the cancel cannot interrupt.
		save func(stopped <-chan struct{}) func(context.Context)
		// resume runs the job again on the same checkpoints after the first
		// Run suspended, cancelled before it starts (a job manager that
		// restarted).
		resume bool
	}{
		{name: "running", moment: func(cancel func(), _ func() *runtime.Job, covered func() int) []runtime.ClusterOpt {
			return []runtime.ClusterOpt{runtime.OnCheckpointComplete(func(runtime.CheckpointEvent) {
				if covered() >= minCovered {
					cancel()
				}
			})}
		}},
		{name: "failing", fail: true, delay: time.Minute, cancelAtFailure: true},
		{name: "failing, the coordinator slow to stop", fail: true, delay: time.Minute, cancelAtFailure: true,
			slowCoordinator: true},
		// The coordinator stops (the cancel cancels its context) between
		// the save and the notification, so the cancel for good reaches
		// tasks that were not notified.
		{name: "as a checkpoint is saved", save: func(<-chan struct{}) func(context.Context) {
			return func(ctx context.Context) { <-ctx.Done() }
		}},
		// The save outlasts the cancel's wait for the coordinator.
		{name: "saving a checkpoint slowly", save: func(stopped <-chan struct{}) func(context.Context) {
			return func(context.Context) { <-stopped }
		}},
		{name: "restarting", fail: true, delay: time.Minute,
			moment: func(cancel func(), _ func() *runtime.Job, _ func() int) []runtime.ClusterOpt {
				return []runtime.ClusterOpt{runtime.OnRestart(func(int, error) { cancel() })}
			}},
		{name: "waiting for slots", fail: true,
			moment: func(cancel func(), job func() *runtime.Job, _ func() int) []runtime.ClusterOpt {
				return []runtime.ClusterOpt{runtime.Deployment(&momentDeployer{job: job, at: 1, cancel: cancel, stage: stageSlots})}
			}},
		{name: "deploying", fail: true,
			moment: func(cancel func(), job func() *runtime.Job, _ func() int) []runtime.ClusterOpt {
				return []runtime.ClusterOpt{runtime.Deployment(&momentDeployer{job: job, at: 1, cancel: cancel, stage: stageDeploying})}
			}},
		{name: "restoring", fail: true,
			moment: func(cancel func(), job func() *runtime.Job, _ func() int) []runtime.ClusterOpt {
				return []runtime.ClusterOpt{runtime.Deployment(&momentDeployer{job: job, at: 1, cancel: cancel, stage: stageOpening})}
			}},
		{name: "job manager just restarted", fail: true, delay: time.Minute, resume: true,
			moment: func(suspend func(), _ func() *runtime.Job, _ func() int) []runtime.ClusterOpt {
				return []runtime.ClusterOpt{runtime.OnRestart(func(int, error) { suspend() })}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := kafkatest.New(t, broker.Config("group.share.record.lock.duration.ms", "600000"))
			env.CreateTopic(t, "lines", 4, nil)
			env.CreateTopic(t, "out", 4, nil)
			const n = 3000
			lines := make([]*kgo.Record, n)
			for i := range lines {
				lines[i] = kgo.StringRecord(fmt.Sprintf("line-%05d", i))
			}
			if err := env.Client(t, kgo.DefaultProduceTopic("lines")).ProduceSync(t.Context(), lines...).FirstErr(); err != nil {
				t.Fatal(err)
			}
			store, err := checkpoint.OpenStore(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
			epochs := newEpochLog()
			job := func() *runtime.Job { return relayJob(t, env.Addr, "relay", epochs, time.Millisecond) }

			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			// The moment cancels the job, or suspends it when it resumes.
			sctx, suspend := context.WithCancel(t.Context())
			defer suspend()
			stop := cancel
			if tt.resume {
				stop = suspend
			}
			var first runtime.CheckpointStorage = store
			if tt.save != nil {
				first = &heldSave{Store: store, hold: func() bool { return epochs.covered() >= minCovered }, cancel: cancel,
					wait: tt.save(epochs.stopped)}
			}
			opts := []runtime.ClusterOpt{runtime.JobID("relay"), runtime.CheckpointStore(first), runtime.Logger(log),
				runtime.CheckpointInterval(50 * time.Millisecond), runtime.CheckpointTimeout(20 * time.Second),
				runtime.Restarts(3, max(tt.delay, time.Millisecond)), runtime.OnRestore(epochs.restored)}
			if tt.fail {
				var once sync.Once
				opts = append(opts, runtime.Failpoints(failpoint.New(failpoint.WithHook(failpoint.JMAfterCheckpointPersisted, func() (err error) {
					if epochs.covered() >= minCovered {
						once.Do(func() {
							err = errors.New("job manager gone")
							if tt.cancelAtFailure {
								cancel()
							}
							if tt.slowCoordinator {
								select {
								case <-epochs.stopped:
								case <-time.After(time.Minute):
									// Not a timed assertion: the run's
									// output decides; this only bounds
									// the wait.
								}
							}
						})
					}
					return err
				}))))
			}
			if tt.resume {
				opts = append(opts, runtime.SuspendWith(sctx))
			}
			if tt.moment != nil {
				opts = append(opts, tt.moment(stop, job, epochs.covered)...)
			}
			_, err = runtime.NewMiniCluster(opts...).Run(ctx, job())
			if tt.resume {
				if !errors.Is(err, runtime.ErrSuspended) {
					t.Fatalf("the first Run returned %v, want it suspended", err)
				}
				// The job manager restarted; the cancel comes before (or as)
				// the job resumes.
				cancel()
				_, err = runtime.NewMiniCluster(runtime.JobID("relay"), runtime.CheckpointStore(store), runtime.Logger(log),
					runtime.CheckpointInterval(50*time.Millisecond)).Run(ctx, job())
			}
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Run of the cancelled job returned %v, want context.Canceled", err)
			}

			latest, _, err := store.LatestUsable(t.Context(), "relay")
			if err != nil {
				t.Fatal(err)
			}
			env.RequireNothingOpen(t, "out", "__weir-acklog-g")
			want := epochs.committedUpTo(t, latest.ID)
			got := keyCounts(env.ReadCommitted(t, "out"))
			if d := diffCounts(got, want); d != "" {
				t.Fatalf("output after the cancel is not what checkpoint %d covers (%d records): %s", latest.ID, countOf(want), d)
			}
			if countOf(want) == 0 || countOf(want) >= n {
				t.Fatalf("checkpoint %d covers %d of %d lines, want some but not all", latest.ID, countOf(want), n)
			}

			// A new job on the same group adds every other line, once.
			after := newEpochLog()
			runUntilAll(t, env, relayJob(t, env.Addr, "after", after, 0), n, runtime.Logger(log),
				runtime.CheckpointInterval(50*time.Millisecond))
			all := keyCounts(env.ReadCommitted(t, "out"))
			wantAll := map[string]int{}
			for _, r := range lines {
				wantAll[string(r.Value)] = 1
			}
			if d := diffCounts(all, wantAll); d != "" {
				t.Fatalf("output of both jobs is not every line once: %s", d)
			}
		})
	}
}

// minCovered is how many records the checkpoints cover when the job fails
// or is cancelled.
const minCovered = 200

// relayJob reads lines from the share group "g" on "lines" and writes each
// to "out" (key and value the line), pausing after each (so that
// checkpoints complete while input remains). epochs records what the sink
// writes.
func relayJob(t *testing.T, addr, name string, epochs *epochLog, pause time.Duration) *runtime.Job {
	t.Helper()
	src, err := sharegroup.New(func(r *kgo.Record) (string, error) { return string(r.Value), nil },
		sharegroup.Brokers(addr), sharegroup.Topics("lines"), sharegroup.Group("g"), sharegroup.BatchSize(50))
	if err != nil {
		t.Fatal(err)
	}
	sink, err := kafka.NewSink(func(s string) (*kgo.Record, error) {
		return &kgo.Record{Topic: "out", Key: []byte(s), Value: []byte(s)}, nil
	}, []kafka.Opt{kafka.Brokers(addr)})
	if err != nil {
		t.Fatal(err)
	}
	j := runtime.NewJob(name, runtime.DefaultParallelism(2))
	lines := runtime.FromSource(j, "lines", src)
	slow := runtime.Map(lines, "slow", func(s string) (string, error) {
		time.Sleep(pause)
		return s, nil
	})
	runtime.SinkTo(slow, "out", func() runtime.Sink[string] { return &recordingSink{Sink: sink(), log: epochs} })
	return j
}

// epochLog records, per attempt, the keys a sink's subtasks wrote before
// each barrier, the attempt that took each checkpoint, and the checkpoint
// each attempt restored: what a completed checkpoint covers.
type epochLog struct {
	mu       sync.Mutex
	cur      map[[2]int][]string                // (attempt, subtask): written since the last snapshot
	epochs   map[int]map[checkpoint.ID][]string // attempt -> checkpoint -> keys
	takenBy  map[checkpoint.ID]int
	restores map[int]checkpoint.ID
	// stopped is closed when a sink is first told the job is cancelled, or
	// closed.
	stopped   chan struct{}
	stopNoted sync.Once
}

func newEpochLog() *epochLog {
	return &epochLog{cur: map[[2]int][]string{}, epochs: map[int]map[checkpoint.ID][]string{},
		takenBy: map[checkpoint.ID]int{}, restores: map[int]checkpoint.ID{}, stopped: make(chan struct{})}
}

// sinkStopped notes that a sink was told the job is cancelled, or closed.
func (l *epochLog) sinkStopped() { l.stopNoted.Do(func() { close(l.stopped) }) }

// covered counts the keys snapshotted so far.
func (l *epochLog) covered() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, byID := range l.epochs {
		for _, keys := range byID {
			n += len(keys)
		}
	}
	return n
}

func (l *epochLog) write(attempt, subtask int, key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := [2]int{attempt, subtask}
	l.cur[k] = append(l.cur[k], key)
}

func (l *epochLog) snapshot(attempt, subtask int, id checkpoint.ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := [2]int{attempt, subtask}
	if l.epochs[attempt] == nil {
		l.epochs[attempt] = map[checkpoint.ID][]string{}
	}
	l.epochs[attempt][id] = append(l.epochs[attempt][id], l.cur[k]...)
	l.cur[k] = nil
	l.takenBy[id] = attempt
}

func (l *epochLog) restored(attempt int, from checkpoint.ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.restores[attempt] = from
}

// committedUpTo is every key the completed checkpoint c covers: the epochs
// up to c of the attempt that took it, and what that attempt restored.
func (l *epochLog) committedUpTo(t *testing.T, c checkpoint.ID) map[string]int {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for c > 0 {
		a, ok := l.takenBy[c]
		if !ok {
			t.Fatalf("no sink snapshot of checkpoint %d was recorded", c)
		}
		for id, keys := range l.epochs[a] {
			if id <= c {
				for _, k := range keys {
					out[k]++
				}
			}
		}
		c = l.restores[a]
	}
	return out
}

// recordingSink is a Kafka sink that records what it wrote per epoch, and
// passes on every contract of the sink.
type recordingSink struct {
	runtime.Sink[string]
	log              *epochLog
	attempt, subtask int
}

var (
	_ checkpoint.AbortCarrier   = (*recordingSink)(nil)
	_ checkpoint.CancelListener = (*recordingSink)(nil)
	_ runtime.RestoreCommitter  = (*recordingSink)(nil)
)

func (s *recordingSink) Open(ctx context.Context, oc *runtime.OperatorContext) error {
	s.attempt, s.subtask = oc.Attempt, oc.Subtask
	return s.Sink.Open(ctx, oc)
}

func (s *recordingSink) Write(ctx context.Context, v string) error {
	if err := s.Sink.Write(ctx, v); err != nil {
		return err
	}
	s.log.write(s.attempt, s.subtask, v)
	return nil
}

func (s *recordingSink) Snapshot(ctx context.Context, id checkpoint.ID) (runtime.OperatorState, error) {
	st, err := s.Sink.Snapshot(ctx, id)
	if err == nil {
		s.log.snapshot(s.attempt, s.subtask, id)
	}
	return st, err
}

func (s *recordingSink) NotifyCheckpointComplete(ctx context.Context, id checkpoint.ID) error {
	return s.Sink.(checkpoint.Listener).NotifyCheckpointComplete(ctx, id)
}

func (s *recordingSink) NotifyCheckpointAborted(ctx context.Context, id checkpoint.ID) error {
	return s.Sink.(checkpoint.Listener).NotifyCheckpointAborted(ctx, id)
}

func (s *recordingSink) CarriesAbortedCheckpoints() {}

func (s *recordingSink) CommitRestored(ctx context.Context, oc *runtime.OperatorContext) error {
	return s.Sink.(runtime.RestoreCommitter).CommitRestored(ctx, oc)
}

func (s *recordingSink) NotifyJobCanceled(ctx context.Context, last checkpoint.ID) error {
	defer s.log.sinkStopped()
	return s.Sink.(checkpoint.CancelListener).NotifyJobCanceled(ctx, last)
}

func (s *recordingSink) Close() error {
	defer s.log.sinkStopped()
	return s.Sink.Close()
}

// heldSave is a checkpoint store whose first Save once hold() is true
// cancels the job (cancel) and then waits (wait, at most a minute)
// before it saves: a save underway that the cancel cannot interrupt.
type heldSave struct {
	*checkpoint.Store
	hold   func() bool
	cancel func()
	wait   func(context.Context)
	once   sync.Once
}

func (h *heldSave) Save(ctx context.Context, c checkpoint.Completed) error {
	if h.hold() {
		h.once.Do(func() {
			h.cancel()
			waited := make(chan struct{})
			go func() {
				defer close(waited)
				h.wait(ctx)
			}()
			select {
			case <-waited:
			case <-time.After(time.Minute): // bounds the hold only: the output decides
			}
			ctx = context.WithoutCancel(ctx)
		})
	}
	return h.Store.Save(ctx, c)
}

// Where momentDeployer cancels the job.
const (
	stageSlots     = iota // before deploying: waiting for slots
	stageDeploying        // deployed (restored transactions committed), not returned yet
	stageOpening          // as the tasks open and restore
)

// momentDeployer deploys every task in this process, as the mini cluster
// does, and cancels the job at stage of attempt at.
type momentDeployer struct {
	job    func() *runtime.Job
	at     int
	cancel func()
	stage  int
}

func (m *momentDeployer) Deploy(ctx context.Context, spec runtime.DeploySpec, rep runtime.TaskReports) (runtime.Deployed, error) {
	if spec.Attempt != m.at {
		return runtime.Deploy(ctx, m.job(), spec, nil, rep)
	}
	if m.stage == stageSlots {
		m.cancel()
		<-ctx.Done()
		return nil, fmt.Errorf("no slots: %w", context.Cause(ctx))
	}
	d, err := runtime.Deploy(ctx, m.job(), spec, nil, rep)
	if err != nil {
		return nil, err
	}
	if m.stage == stageDeploying {
		m.cancel()
		<-ctx.Done()
		d.Cancel(false)
		d.Wait()
		return nil, fmt.Errorf("deployment stopped: %w", context.Cause(ctx))
	}
	return openingDeployment{d, m.cancel}, nil
}

// openingDeployment cancels the job as its tasks open.
type openingDeployment struct {
	runtime.Deployed
	cancel func()
}

func (d openingDeployment) Open(ctx context.Context, timing checkpoint.Timing) error {
	d.cancel()
	<-ctx.Done()
	return d.Deployed.Open(ctx, timing)
}

// runUntilAll runs job until "out" holds n distinct keys read_committed,
// then cancels it.
func runUntilAll(t *testing.T, env *kafkatest.Env, job *runtime.Job, n int, opts ...runtime.ClusterOpt) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := runtime.NewMiniCluster(opts...).Run(ctx, job)
		done <- err
	}()
	defer func() {
		cancel()
		<-done
	}()
	for deadline := time.Now().Add(90 * time.Second); ; {
		got := keyCounts(env.ReadCommitted(t, "out"))
		if len(got) >= n {
			return
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("the second job stopped (%v) with %d of %d lines in the output", err, len(got), n)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second job output %d of %d lines in 90s: the rest is held or lost", len(got), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func keyCounts(recs []*kgo.Record) map[string]int {
	out := map[string]int{}
	for _, r := range recs {
		out[string(r.Key)]++
	}
	return out
}

func countOf(m map[string]int) int {
	n := 0
	for _, c := range m {
		n += c
	}
	return n
}

// diffCounts describes how got differs from want ("" if not at all).
func diffCounts(got, want map[string]int) string {
	var missing, extra, dup []string
	for k, w := range want {
		switch g := got[k]; {
		case g < w:
			missing = append(missing, k)
		case g > w:
			dup = append(dup, k)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			extra = append(extra, k)
		}
	}
	if len(missing)+len(extra)+len(dup) == 0 {
		return ""
	}
	sort.Strings(missing)
	sort.Strings(extra)
	sort.Strings(dup)
	return fmt.Sprintf("%d missing (%.5v), %d unexpected (%.5v), %d too often (%.5v)",
		len(missing), missing, len(extra), extra, len(dup), dup)
}
