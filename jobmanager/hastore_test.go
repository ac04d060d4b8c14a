package jobmanager

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/jobmanager/ha"
	"github.com/weirstream/weir/runtime"
)

func startEtcd(t *testing.T) []string {
	t.Helper()
	e, err := ha.StartEmbedded(t.Context(), t.TempDir(), ha.FastForTests())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e.Endpoints()
}

func connectHA(t *testing.T, endpoints []string, cluster string) *ha.Services {
	t.Helper()
	s, err := ha.New(t.Context(), endpoints, cluster, ha.LeaseTTL(4*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func campaign(t *testing.T, s *ha.Services, addr string) *ha.Leadership {
	t.Helper()
	l, err := s.Campaign(t.Context(), addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Resign(context.Background()) })
	return l
}

func memStorage(t *testing.T) storage.Storage {
	t.Helper()
	st, err := storage.Open(t.Context(), "mem://test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// completed is checkpoint id of job with one task whose sink pre-committed
// one transaction.
func completed(job string, id checkpoint.ID) checkpoint.Completed {
	now := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC).Add(time.Duration(id) * time.Second)
	return checkpoint.Completed{Job: job, ID: id, TriggeredAt: now, CompletedAt: now.Add(time.Millisecond),
		Tasks: map[checkpoint.TaskID]checkpoint.TaskSnapshot{"sink#0": {Task: "sink#0", Operators: []checkpoint.OperatorSnapshot{{
			UID: "sink", Parallelism: 1, MaxParallelism: 128, State: [][]byte{[]byte(fmt.Sprintf("state@%d", id))},
			Handles: []checkpoint.TxnHandle{{TransactionalID: "t-0", ProducerID: 7, Epoch: int16(id), Checkpoint: id}},
		}}}}}
}

func objectKeys(t *testing.T, st storage.Storage) []string {
	t.Helper()
	var keys []string
	if err := st.List(t.Context(), "", func(o storage.Object) error { keys = append(keys, o.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	return keys
}

func TestHACheckpointStoreKeepsTheLastCheckpointsAcrossLeadersAndDeletesSubsumedMetadata(t *testing.T) {
	ctx := t.Context()
	endpoints := startEtcd(t)
	st := memStorage(t)
	a := connectHA(t, endpoints, "prod")
	la := campaign(t, a, "jm-a:6123")
	cps := newHACheckpointStore(a, la, st)
	var last checkpoint.ID
	for range 5 {
		id, err := cps.NextID(ctx, "job1")
		if err != nil {
			t.Fatal(err)
		}
		if id <= last {
			t.Fatalf("NextID %d after %d", id, last)
		}
		last = id
		if err := cps.Save(ctx, completed("job1", id)); err != nil {
			t.Fatal(err)
		}
	}
	// An id handed out but never saved is not handed out again.
	skippedID, err := cps.NextID(ctx, "job1")
	if err != nil {
		t.Fatal(err)
	}
	if err := cps.Save(ctx, completed("job1", last)); !errors.Is(err, checkpoint.ErrIDNotIncreasing) {
		t.Fatalf("saving checkpoint %d again: %v, want ErrIDNotIncreasing", last, err)
	}
	sums, err := cps.List(ctx, "job1")
	if err != nil {
		t.Fatal(err)
	}
	var ids []checkpoint.ID
	for _, s := range sums {
		if s.Err != nil {
			t.Fatalf("checkpoint %d: %v", s.ID, s.Err)
		}
		ids = append(ids, s.ID)
	}
	if want := []checkpoint.ID{last, last - 1, last - 2}; !slices.Equal(ids, want) {
		t.Fatalf("retained checkpoints %v, want %v", ids, want)
	}
	if got, want := objectKeys(t, st), []string{
		metadataKey("job1", last-2), metadataKey("job1", last-1), metadataKey("job1", last),
	}; !slices.Equal(got, want) {
		t.Fatalf("objects in the checkpoint storage %q, want only the retained checkpoints' metadata %q", got, want)
	}
	// Get reads each retained checkpoint (the state GC's view of them);
	// a subsumed one is gone.
	for _, id := range ids {
		if c, err := cps.Get(ctx, "job1", id); err != nil || c.ID != id {
			t.Fatalf("Get(%d): checkpoint %d, %v", id, c.ID, err)
		}
	}
	if _, err := cps.Get(ctx, "job1", last-3); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("Get of subsumed checkpoint %d: %v, want ErrNotFound", last-3, err)
	}

	// A new leader (another job manager) restores the same checkpoint and
	// continues the ids above every id the old one handed out.
	if err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	b := connectHA(t, endpoints, "prod")
	lb := campaign(t, b, "jm-b:6123")
	cpsB := newHACheckpointStore(b, lb, st)
	c, skipped, err := cpsB.LatestUsable(ctx, "job1")
	if err != nil || len(skipped) > 0 {
		t.Fatalf("LatestUsable on the new leader: %v, skipped %v", err, skipped)
	}
	if want := completed("job1", last); c.ID != want.ID || !bytes.Equal(c.Tasks["sink#0"].Operators[0].State[0], want.Tasks["sink#0"].Operators[0].State[0]) {
		t.Fatalf("new leader restores checkpoint %d %+v, want %d", c.ID, c, last)
	}
	next, err := cpsB.NextID(ctx, "job1")
	if err != nil || next <= skippedID {
		t.Fatalf("new leader's NextID %d, %v; want above %d", next, err, skippedID)
	}
}

func TestADeposedLeadersWritesFailAndCommitNothing(t *testing.T) {
	ctx := t.Context()
	endpoints := startEtcd(t)
	st := memStorage(t)
	a := connectHA(t, endpoints, "prod")
	la := campaign(t, a, "jm-a:6123")
	cps, js := newHACheckpointStore(a, la, st), newHAJobStore(a, la)
	if err := js.Put(JobRecord{ID: "job1", Type: "wordcount", State: StateRunning}); err != nil {
		t.Fatal(err)
	}
	id, err := cps.NextID(ctx, "job1")
	if err != nil {
		t.Fatal(err)
	}
	if err := cps.Save(ctx, completed("job1", id)); err != nil {
		t.Fatal(err)
	}

	// b takes over; a is deposed.
	b := connectHA(t, endpoints, "prod")
	won := make(chan *ha.Leadership, 1)
	go func() {
		l, err := b.Campaign(ctx, "jm-b:6123")
		if err != nil {
			t.Error(err)
		}
		won <- l
	}()
	if err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	lb := <-won
	if lb == nil {
		t.FailNow()
	}
	defer lb.Resign(context.WithoutCancel(ctx))

	if err := cps.Save(ctx, completed("job1", id+1)); !errors.Is(err, ha.ErrNotLeader) || errors.Is(err, checkpoint.ErrOutcomeUnknown) {
		t.Fatalf("deposed leader's Save: %v, want ErrNotLeader (and a known outcome)", err)
	}
	if _, err := cps.NextID(ctx, "job1"); !errors.Is(err, ha.ErrNotLeader) {
		t.Fatalf("deposed leader's NextID: %v, want ErrNotLeader", err)
	}
	if err := js.Put(JobRecord{ID: "job1", Type: "wordcount", State: StateCanceled}); !errors.Is(err, ha.ErrNotLeader) {
		t.Fatalf("deposed leader's job Put: %v, want ErrNotLeader", err)
	}
	cpsB, jsB := newHACheckpointStore(b, lb, st), newHAJobStore(b, lb)
	c, err := cpsB.Latest(ctx, "job1")
	if err != nil || c.ID != id {
		t.Fatalf("latest checkpoint after the deposed leader's save: %d, %v; want %d", c.ID, err, id)
	}
	if r, err := jsB.Get("job1"); err != nil || r.State != StateRunning {
		t.Fatalf("job record after the deposed leader's put: %+v, %v; want RUNNING", r, err)
	}
	if got := objectKeys(t, st); !slices.Equal(got, []string{metadataKey("job1", id)}) {
		t.Fatalf("objects %q: the deposed leader's uncommitted metadata must not stay", got)
	}
}

func TestTwoClustersOnOneEtcdNeverSeeEachOthersJobsOrCheckpoints(t *testing.T) {
	ctx := t.Context()
	endpoints := startEtcd(t)
	st := memStorage(t)
	a, b := connectHA(t, endpoints, "team-a"), connectHA(t, endpoints, "team-b")
	la, lb := campaign(t, a, "a:1"), campaign(t, b, "b:1") // both lead: one per cluster
	if err := newHAJobStore(a, la).Put(JobRecord{ID: "job1", Type: "wordcount", State: StateRunning}); err != nil {
		t.Fatal(err)
	}
	cpsA := newHACheckpointStore(a, la, st)
	id, err := cpsA.NextID(ctx, "job1")
	if err != nil {
		t.Fatal(err)
	}
	if err := cpsA.Save(ctx, completed("job1", id)); err != nil {
		t.Fatal(err)
	}
	jsB := newHAJobStore(b, lb)
	if recs, err := jsB.List(); err != nil || len(recs) != 0 {
		t.Fatalf("cluster b lists %+v, %v; want nothing", recs, err)
	}
	if _, err := jsB.Get("job1"); !errors.Is(err, ErrJobNotFound) {
		t.Fatalf("cluster b gets job1: %v, want ErrJobNotFound", err)
	}
	if _, _, err := newHACheckpointStore(b, lb, st).LatestUsable(ctx, "job1"); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("cluster b's latest checkpoint of job1: %v, want ErrNotFound", err)
	}
}

func TestAMissingOrDamagedMetadataObjectIsSkippedWithItsHandles(t *testing.T) {
	ctx := t.Context()
	endpoints := startEtcd(t)
	st := memStorage(t)
	a := connectHA(t, endpoints, "prod")
	cps := newHACheckpointStore(a, campaign(t, a, "a:1"), st)
	for id := checkpoint.ID(1); id <= 3; id++ {
		if err := cps.Save(ctx, completed("job1", id)); err != nil {
			t.Fatal(err)
		}
	}
	// 3's state damaged (its handles intact), 2's metadata gone.
	b, err := checkpoint.EncodeCompleted(completed("job1", 3))
	if err != nil {
		t.Fatal(err)
	}
	b[len("WCK1")+10] ^= 0xff
	if err := st.Put(ctx, metadataKey("job1", 3), bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(ctx, metadataKey("job1", 2)); err != nil {
		t.Fatal(err)
	}
	c, skipped, err := cps.LatestUsable(ctx, "job1")
	if err != nil || c.ID != 1 {
		t.Fatalf("LatestUsable: %d, %v; want checkpoint 1", c.ID, err)
	}
	if len(skipped) != 2 || skipped[0].ID != 3 || !skipped[0].HandlesOK || len(skipped[0].Handles) != 1 ||
		skipped[1].ID != 2 || skipped[1].HandlesOK || !errors.Is(skipped[1].Err, checkpoint.ErrCorrupt) {
		t.Fatalf("skipped %+v; want 3 with its handle, then 2 without", skipped)
	}
	if _, err := cps.Latest(ctx, "job1"); !errors.Is(err, checkpoint.ErrCorrupt) {
		t.Fatalf("Latest: %v, want ErrCorrupt (no silent fallback)", err)
	}
}

// A new leader resumes the jobs whose records have not ended and never runs
// a finished, failed or cancelled job again.
func TestANewLeaderResumesOnlyJobsThatHaveNotEnded(t *testing.T) {
	endpoints := startEtcd(t)
	st := memStorage(t)
	prev := connectHA(t, endpoints, "prod")
	lp := campaign(t, prev, "jm-old:6123")
	js := newHAJobStore(prev, lp)
	for id, state := range map[string]JobState{"running": StateRunning, "restarting": StateRestarting,
		"finished": StateFinished, "failed": StateFailed, "canceled": StateCanceled} {
		if err := js.Put(JobRecord{ID: id, Type: "idle", State: state, CheckpointIntervalMs: 1000, Params: map[string]string{}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := lp.Resign(t.Context()); err != nil {
		t.Fatal(err)
	}

	reg := runtime.NewRegistry()
	if err := reg.Register(runtime.JobType{Name: "idle", Build: func(runtime.Params) (*runtime.Job, error) {
		job := runtime.NewJob("idle", runtime.DefaultParallelism(1))
		nums := runtime.FromSource(job, "numbers", runtime.SliceSource([]int{1}, 0))
		runtime.SinkTo(nums, "discard", runtime.SinkFunc(func(context.Context, int) error { return nil }))
		return job, nil
	}}); err != nil {
		t.Fatal(err)
	}
	s, err := New(Jobs(reg), HighAvailability(connectHA(t, endpoints, "prod"), st))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, lis) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s.jobs.mu.Lock()
		n := len(s.jobs.running)
		s.jobs.mu.Unlock()
		if s.leadingTerm() != nil && n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: leading %v, %d jobs running; want the 2 that had not ended", s.leadingTerm() != nil, n)
		}
	}
	s.jobs.mu.Lock()
	var running []string
	for id := range s.jobs.running {
		running = append(running, id)
	}
	s.jobs.mu.Unlock()
	slices.Sort(running)
	if !slices.Equal(running, []string{"restarting", "running"}) {
		t.Fatalf("the new leader runs %v; want only the jobs that had not ended", running)
	}
	for id, want := range map[string]JobState{"finished": StateFinished, "failed": StateFailed, "canceled": StateCanceled} {
		if r, err := s.jobs.store.Get(id); err != nil || r.State != want {
			t.Errorf("job %s after the new leader started: %+v, %v; want %s, untouched", id, r.State, err, want)
		}
	}
	// The failover is recorded in each resumed job: a restart, and an
	// entry of its exception history naming the new leader.
	want := "job manager failover: resumed by " + s.advertised + " with no completed checkpoint (from the start)"
	for _, id := range running {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			r, err := s.jobs.store.Get(id)
			if err != nil {
				t.Fatal(err)
			}
			if e := r.LastException(); r.Restarts == 1 && e != nil && e.Message == want && e.Restarted {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s after the failover: %d restarts, exceptions %+v; want 1 restart and %q", id, r.Restarts, r.Exceptions, want)
			}
		}
	}
}
