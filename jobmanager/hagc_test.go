package jobmanager

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/weirstream/weir/checkpoint"
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
