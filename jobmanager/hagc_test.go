package jobmanager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/jobmanager/ha"
	"github.com/weirstream/weir/runtime"
)

// keysOnce emits the keys 0..n-1 once and then nothing, for ever: the
// keyed state after it stops changing, so every later checkpoint reuses
// the objects its key groups were first written to.
type keysOnce struct {
	n    int
	done bool
}

func (s *keysOnce) Open(_ context.Context, oc *runtime.OperatorContext) error {
	s.done = len(oc.Restored) > 0
	return nil
}

func (s *keysOnce) Poll(ctx context.Context, out runtime.Collector[int]) error {
	if s.done {
		select {
		case <-ctx.Done():
		case <-time.After(time.Millisecond):
		}
		return nil
	}
	for k := range s.n {
		out.Collect(k)
	}
	s.done = true
	return nil
}

func (s *keysOnce) Snapshot(context.Context, checkpoint.ID) (runtime.OperatorState, error) {
	if !s.done {
		return runtime.OperatorState{}, nil
	}
	return runtime.OperatorState{Entries: [][]byte{[]byte("done")}}, nil
}

func (s *keysOnce) Close() error { return nil }

// keyedSumJob counts 64 keys once and then idles.
func keyedSumJob() *runtime.Job {
	job := runtime.NewJob("keyed-sum", runtime.DefaultParallelism(1))
	keys := runtime.FromSource(job, "keys", func() runtime.Source[int] { return &keysOnce{n: 64} })
	sums := runtime.Reduce(runtime.KeyBy(keys, func(k int) int { return k }, runtime.IntCodec()), "sum",
		func(acc, v int) (int, error) { return acc + v, nil }, runtime.IntCodec())
	runtime.SinkTo(sums, "discard", runtime.SinkFunc(func(context.Context, int) error { return nil }))
	return job
}

// pausingStore is a job master's checkpoint store that, once armed,
// stops right after a save succeeded, before the job master's cleanup of
// that save runs: the job master paused (SIGSTOP, a long GC) at the worst
// moment.
type pausingStore struct {
	*haCheckpointStore
	from    checkpoint.ID // pause after saving a checkpoint with at least this id
	once    sync.Once
	saved   chan checkpoint.ID
	release chan struct{}
}

func (p *pausingStore) Save(ctx context.Context, c checkpoint.Completed) error {
	err := p.haCheckpointStore.Save(ctx, c)
	if err == nil && c.ID >= p.from {
		p.once.Do(func() {
			p.saved <- c.ID
			<-p.release
		})
	}
	return err
}

// revokeAllLeases revokes every lease of the etcd at endpoints behind the
// back of whoever holds one: as if it expired while its holder was paused.
func revokeAllLeases(t *testing.T, endpoints []string) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	leases, err := cli.Leases(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases.Leases {
		if _, err := cli.Revoke(t.Context(), l.ID); err != nil {
			t.Fatal(err)
		}
	}
}

// The deposed-leader race of issue 38: the old job master saves checkpoint
// n and pauses before its post-save cleanup; its lease is revoked behind
// its back; a new leader restores n, completes three more checkpoints that
// reuse n's key-group objects, and retention drops n. The old one resumes
// and cleans up before it noticed the lost lease. The new leader's latest
// checkpoint must still restore: every object it references exists.
func TestADeposedJobMasterDeletesNothingTheNewLeadersCheckpointsUse(t *testing.T) {
	ctx := t.Context()
	endpoints := startEtcd(t)
	st := memStorage(t)
	// A long lease: the old leader's own renewals (every sixth of it) do
	// not notice the revocation while the test runs; only a fenced call
	// can tell it.
	a, err := ha.New(ctx, endpoints, "prod", ha.LeaseTTL(2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	la, err := a.Campaign(ctx, "jm-a:6123")
	if err != nil {
		t.Fatal(err)
	}
	old := &pausingStore{haCheckpointStore: newHACheckpointStore(a, la, st), from: 4,
		saved: make(chan checkpoint.ID, 1), release: make(chan struct{})}
	opts := func(store runtime.CheckpointStorage, more ...runtime.ClusterOpt) []runtime.ClusterOpt {
		return append([]runtime.ClusterOpt{runtime.CheckpointStore(store), runtime.StateStorage(st, "mem://test"),
			runtime.StateInlineLimit(-1), runtime.CheckpointInterval(5 * time.Millisecond), runtime.JobID("job1")}, more...)
	}
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	aDone := make(chan error, 1)
	go func() {
		_, err := runtime.NewMiniCluster(opts(old)...).Run(actx, keyedSumJob())
		aDone <- err
	}()
	var n checkpoint.ID
	select {
	case n = <-old.saved:
	case err := <-aDone:
		t.Fatalf("the old job master ended before checkpoint 4: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the old job master saved no checkpoint 4 in a minute")
	}

	// The old leader's lease ends behind its back; a new leader takes
	// over, restores n and completes three checkpoints after it.
	revokeAllLeases(t, endpoints)
	b := connectHA(t, endpoints, "prod")
	lb := campaign(t, b, "jm-b:6123")
	newStore := newHACheckpointStore(b, lb, st)
	bctx, bcancel := context.WithCancel(ctx)
	defer bcancel()
	var restored, latest checkpoint.ID
	var mu sync.Mutex
	_, err = runtime.NewMiniCluster(opts(newStore,
		runtime.OnRestore(func(_ int, from checkpoint.ID) {
			mu.Lock()
			restored = from
			mu.Unlock()
		}),
		runtime.OnCheckpointComplete(func(e runtime.CheckpointEvent) {
			mu.Lock()
			defer mu.Unlock()
			if latest = e.ID; e.ID >= restored+3 {
				bcancel()
			}
		}))...).Run(bctx, keyedSumJob())
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("new leader's run: %v", err)
	}
	mu.Lock()
	if restored != n {
		t.Fatalf("the new leader restored checkpoint %d, want %d", restored, n)
	}
	mu.Unlock()
	c, err := newStore.Latest(ctx, "job1")
	if err != nil {
		t.Fatal(err)
	}
	reused := false
	for _, r := range c.Refs() {
		reused = reused || r.Checkpoint <= n
	}
	if c.ID < n+3 || !reused {
		t.Fatalf("the new leader's latest checkpoint %d (after %d) reuses no object of checkpoint %d or before", c.ID, latest, n)
	}
	sums, err := newStore.List(ctx, "job1")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sums {
		if s.ID <= n {
			t.Fatalf("checkpoint %d is still retained; the test needs retention to have dropped %d", s.ID, n)
		}
	}

	// The old job master resumes, not having noticed.
	if err := la.Err(); err != nil {
		t.Fatalf("the old leader noticed the lost lease before resuming (%v): the test does not test the race", err)
	}
	close(old.release)
	// Its next fenced write fails, so it notices; then it is cancelled and
	// its end (the job-end cleanup) runs too.
	select {
	case <-la.Lost():
	case <-time.After(time.Minute):
		t.Fatal("the old leader never noticed it lost the leadership")
	}
	acancel()
	<-aDone

	if _, err := checkpoint.ReadRefs(ctx, st, c.Refs()); err != nil {
		t.Fatalf("the new leader's latest checkpoint %d can no longer be restored: %v", c.ID, err)
	}
	for _, s := range sums {
		rc, err := st.Open(ctx, metadataKey("job1", s.ID), 0, -1)
		if err != nil {
			t.Fatalf("metadata of retained checkpoint %d: %v", s.ID, err)
		}
		rc.Close()
	}
}

// lateStore is a job master's checkpoint store whose save of checkpoint at
// times out and is applied later by etcd: its Save says the outcome is
// unknown and writes nothing; the write lands just before the next
// attempt reads where to restore from, after that attempt's job master
// rebuilt its registry.
type lateStore struct {
	*haCheckpointStore
	at checkpoint.ID

	mu      sync.Mutex
	pending *checkpoint.Completed
	applied bool
}

func (s *lateStore) Save(ctx context.Context, c checkpoint.Completed) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.ID >= s.at && !s.applied && s.pending == nil {
		s.pending = &c
		return fmt.Errorf("save checkpoint %d: %w: etcd did not answer in time", c.ID, checkpoint.ErrOutcomeUnknown)
	}
	return s.haCheckpointStore.Save(ctx, c)
}

func (s *lateStore) LatestUsable(ctx context.Context, job string) (checkpoint.Completed, []checkpoint.Skipped, error) {
	s.mu.Lock()
	if s.pending != nil {
		if err := s.haCheckpointStore.Save(ctx, *s.pending); err != nil {
			s.mu.Unlock()
			return checkpoint.Completed{}, nil, err
		}
		s.pending, s.applied = nil, true
	}
	s.mu.Unlock()
	return s.haCheckpointStore.LatestUsable(ctx, job)
}

// A checkpoint whose pointer write timed out and was applied afterwards:
// the next attempt restores it, so its objects must not have been deleted
// as a failed checkpoint's when that attempt started.
func TestACheckpointWhosePointerWriteLandedLateKeepsItsObjects(t *testing.T) {
	ctx := t.Context()
	endpoints := startEtcd(t)
	st := memStorage(t)
	a := connectHA(t, endpoints, "prod")
	store := &lateStore{haCheckpointStore: newHACheckpointStore(a, campaign(t, a, "jm-a:6123"), st), at: 4}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	var restored []checkpoint.ID
	_, err := runtime.NewMiniCluster(runtime.CheckpointStore(store), runtime.StateStorage(st, "mem://test"),
		runtime.StateInlineLimit(-1), runtime.CheckpointInterval(5*time.Millisecond), runtime.JobID("job1"),
		runtime.RestartStrategy(runtime.FixedDelayRestart(3, 10*time.Millisecond)), runtime.OrphanGrace(runtime.DefaultOrphanGrace),
		runtime.OnRestore(func(_ int, from checkpoint.ID) {
			mu.Lock()
			restored = append(restored, from)
			mu.Unlock()
		}),
		runtime.OnCheckpointComplete(func(e runtime.CheckpointEvent) {
			mu.Lock()
			defer mu.Unlock()
			if n := len(restored); n > 1 && e.ID >= restored[n-1]+2 {
				cancel()
			}
		})).Run(rctx, keyedSumJob())
	mu.Lock()
	defer mu.Unlock()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("run: %v (restored from %v), want it to run on until cancelled", err, restored)
	}
	if len(restored) != 2 || restored[1] < store.at {
		t.Fatalf("restored from %v, want one restart from the checkpoint whose save landed late (%d or later)", restored, store.at)
	}
	c, err := store.Latest(ctx, "job1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checkpoint.ReadRefs(ctx, st, c.Refs()); err != nil {
		t.Fatalf("latest checkpoint %d: %v", c.ID, err)
	}
}

// Metadata objects no pointer names (the pointer write failed, or the job
// manager died between the two) are swept once older than the cutoff, on
// a fenced read: a deposed leader sweeps nothing.
func TestMetadataObjectsNoPointerNamesAreSweptOnlyByTheLeaderAfterTheGrace(t *testing.T) {
	ctx := t.Context()
	endpoints := startEtcd(t)
	st := memStorage(t)
	a := connectHA(t, endpoints, "prod")
	la := campaign(t, a, "jm-a:6123")
	cps := newHACheckpointStore(a, la, st)
	for id := checkpoint.ID(1); id <= 2; id++ {
		if err := cps.Save(ctx, completed("job1", id)); err != nil {
			t.Fatal(err)
		}
	}
	orphan := metadataKey("job1", 3)
	other := metadataKey("job2", 3)
	for _, k := range []string{orphan, other} {
		if err := st.Put(ctx, k, strings.NewReader("a checkpoint whose pointer write failed")); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := cps.SweepOrphans(ctx, "job1", time.Now().Add(-time.Minute)); err != nil || n != 0 {
		t.Fatalf("sweep with a cutoff before the orphan was written: %d deleted, %v; want none", n, err)
	}
	// A deposed leader sweeps nothing.
	revokeAllLeases(t, endpoints)
	b := connectHA(t, endpoints, "prod")
	lb := campaign(t, b, "jm-b:6123")
	if n, err := cps.SweepOrphans(ctx, "job1", time.Now().Add(time.Minute)); !errors.Is(err, ha.ErrNotLeader) || n != 0 {
		t.Fatalf("a deposed leader's sweep: %d deleted, %v; want none and ErrNotLeader", n, err)
	}
	if n, err := newHACheckpointStore(b, lb, st).SweepOrphans(ctx, "job1", time.Now().Add(time.Minute)); err != nil || n != 1 {
		t.Fatalf("the leader's sweep: %d deleted, %v; want the orphan", n, err)
	}
	if got, want := objectKeys(t, st), []string{metadataKey("job1", 1), metadataKey("job1", 2), other}; !slices.Equal(got, want) {
		t.Fatalf("objects after the sweep %q, want %q", got, want)
	}
}

// countingStorage counts the objects opened for reading.
type countingStorage struct {
	storage.Storage
	mu    sync.Mutex
	opens int
}

func (c *countingStorage) Open(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	c.mu.Lock()
	c.opens++
	c.mu.Unlock()
	return c.Storage.Open(ctx, key, off, n)
}

func (c *countingStorage) reads() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.opens
	c.opens = 0
	return n
}

// List (status, list, the REST API) reads each retained checkpoint's
// metadata object once: an object a pointer names never changes.
// Latest, which a restore reads, reads afresh.
func TestListingCheckpointsReadsEachMetadataObjectOnce(t *testing.T) {
	ctx := t.Context()
	endpoints := startEtcd(t)
	st := &countingStorage{Storage: memStorage(t)}
	a := connectHA(t, endpoints, "prod")
	cps := newHACheckpointStore(a, campaign(t, a, "jm-a:6123"), st)
	for id := checkpoint.ID(1); id <= 3; id++ {
		if err := cps.Save(ctx, completed("job1", id)); err != nil {
			t.Fatal(err)
		}
	}
	st.reads()
	for i, want := range []int{3, 0, 0} {
		sums, err := cps.List(ctx, "job1")
		if err != nil || len(sums) != 3 {
			t.Fatalf("List: %d checkpoints, %v", len(sums), err)
		}
		if got := st.reads(); got != want {
			t.Fatalf("List %d read %d metadata objects, want %d", i+1, got, want)
		}
	}
	// A new checkpoint: retention drops the oldest; List reads only the
	// new one, and the cache forgets the dropped one.
	if err := cps.Save(ctx, completed("job1", 4)); err != nil {
		t.Fatal(err)
	}
	st.reads()
	if sums, err := cps.List(ctx, "job1"); err != nil || len(sums) != 3 || sums[0].ID != 4 {
		t.Fatalf("List after checkpoint 4: %+v, %v", sums, err)
	}
	if got := st.reads(); got != 1 {
		t.Fatalf("List after a new checkpoint read %d metadata objects, want 1", got)
	}
	if n := cps.cachedObjects(); n != 3 {
		t.Fatalf("%d metadata objects cached, want the 3 retained", n)
	}
	if _, err := cps.Latest(ctx, "job1"); err != nil {
		t.Fatal(err)
	}
	if got := st.reads(); got != 1 {
		t.Fatalf("Latest read %d metadata objects, want 1 (afresh)", got)
	}
}
