package cluster

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"net"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/internal/s3server"
	"github.com/weirstream/weir/jobmanager"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/taskmanager"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// rec is one record of the big-state job: key's round-th occurrence.
type rec struct {
	Key   string
	Round int64
}

// bigJob describes the big-state job: keys keys, each seen once per round
// for rounds rounds, whose keyed state is a blob of pad bytes per key. The
// sources stop after round pause until resume is closed.
type bigJob struct {
	keys, rounds, pause, pad int
	resume                   chan struct{}
	paused                   atomic.Int32 // source subtasks that reached the pause
	txns                     *memTxns
	viol                     violations
}

// blob is key's state after round: round, then bytes derived from key and
// round, so a byte lost, altered or left over from another round shows.
func blob(key string, round int64, pad int) []byte {
	b := make([]byte, pad)
	binary.BigEndian.PutUint64(b, uint64(round))
	h := fnv.New64a()
	h.Write([]byte(key))
	x := h.Sum64() ^ uint64(round)*0x9e3779b97f4a7c15
	for i := 8; i+8 <= pad; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	return b
}

func (j *bigJob) register(t *testing.T, reg *runtime.Registry) {
	t.Helper()
	err := reg.Register(runtime.JobType{Name: "bigstate", Build: func(runtime.Params) (*runtime.Job, error) {
		job := runtime.NewJob("bigstate", runtime.DefaultParallelism(2))
		recs := runtime.FromSource(job, "source", func() runtime.Source[rec] { return &roundSource{j: j} })
		keyed := runtime.KeyBy(recs, func(r rec) string { return r.Key }, nil)
		checked := runtime.Process(keyed, "checker", func() runtime.KeyedProcessFunction[string, rec, rec] {
			return &blobChecker{j: j}
		})
		runtime.SinkTo(checked, "sink", func() runtime.Sink[rec] { return &txnSink{txns: j.txns} })
		return job, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
}

// roundSource emits every key of its split once per round; its state is
// the rounds it emitted.
type roundSource struct {
	j       *bigJob
	split   int
	splits  int
	emitted int
	paused  bool
}

func (s *roundSource) Open(_ context.Context, oc *runtime.OperatorContext) error {
	s.split, s.splits = oc.Subtask, oc.Parallelism
	for _, e := range oc.Restored {
		if len(e) != 16 {
			return fmt.Errorf("bad source state %x", e)
		}
		s.split, s.emitted = int(binary.BigEndian.Uint64(e)), int(binary.BigEndian.Uint64(e[8:]))
	}
	return nil
}

func (s *roundSource) Poll(ctx context.Context, out runtime.Collector[rec]) error {
	if s.emitted == s.j.pause {
		select {
		case <-s.j.resume:
		default:
			if !s.paused {
				s.paused = true
				s.j.paused.Add(1)
			}
			select {
			case <-s.j.resume:
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
			return nil
		}
	}
	if s.emitted == s.j.rounds {
		return runtime.ErrEndOfInput
	}
	s.emitted++
	for k := s.split; k < s.j.keys; k += s.splits {
		out.Collect(rec{Key: "k" + strconv.Itoa(k), Round: int64(s.emitted)})
	}
	return nil
}

func (s *roundSource) Snapshot(context.Context, checkpoint.ID) (runtime.OperatorState, error) {
	e := binary.BigEndian.AppendUint64(nil, uint64(s.split))
	return runtime.OperatorState{Entries: [][]byte{binary.BigEndian.AppendUint64(e, uint64(s.emitted))}}, nil
}

func (s *roundSource) Close() error { return nil }

// blobChecker keeps each key's blob as keyed state and reports a round
// that does not follow the one its state holds, or a blob that is not
// exactly what the previous round wrote.
type blobChecker struct {
	j     *bigJob
	state *runtime.ValueState[[]byte]
}

func (c *blobChecker) Open(_ context.Context, st *runtime.StateRegistry[string]) error {
	var err error
	c.state, err = runtime.NewValueState[[]byte](st, "blob", nil)
	return err
}

func (c *blobChecker) Process(key string, r rec, out runtime.Collector[rec]) error {
	prev, ok := c.state.Value()
	switch {
	case !ok && r.Round != 1:
		c.j.viol.add(fmt.Sprintf("key %s: round %d with no state", key, r.Round))
	case ok && !bytes.Equal(prev, blob(key, r.Round-1, c.j.pad)):
		c.j.viol.add(fmt.Sprintf("key %s: round %d finds state that is not round %d's", key, r.Round, r.Round-1))
	}
	c.state.Update(blob(key, r.Round, c.j.pad))
	out.Collect(r)
	return nil
}

type violations struct {
	mu   sync.Mutex
	list []string
}

func (v *violations) add(s string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.list = append(v.list, s)
}

func (v *violations) get() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.list)
}

// memTxns stands in for a transactional external system: a sink subtask's
// transaction per checkpoint outlives the subtask (as Kafka's do) and is
// committed or aborted by id.
type memTxns struct {
	mu        sync.Mutex
	open      map[string][]rec
	committed []rec
}

func (m *memTxns) put(id string, recs []rec) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.open[id] = recs
}

func (m *memTxns) commit(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if recs, ok := m.open[id]; ok {
		m.committed = append(m.committed, recs...)
		delete(m.open, id)
	}
}

// abortAllBut aborts the open transactions named prefix... but keep.
func (m *memTxns) abortAllBut(prefix string, keep map[string]bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id := range m.open {
		if len(id) > len(prefix) && id[:len(prefix)] == prefix && !keep[id] {
			delete(m.open, id)
		}
	}
}

func (m *memTxns) output() []rec {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.committed)
}

// txnSink is a two-phase-commit sink over memTxns: it pre-commits each
// checkpoint's records at the barrier and commits them when the checkpoint
// completes, or on restore.
type txnSink struct {
	txns    *memTxns
	oc      *runtime.OperatorContext
	cur     []rec
	pending []checkpoint.TxnHandle
}

func (s *txnSink) Open(_ context.Context, oc *runtime.OperatorContext) error {
	s.oc = oc
	keep := map[string]bool{}
	for _, h := range oc.CommitHandles {
		s.txns.commit(h.TransactionalID)
		keep[h.TransactionalID] = true
	}
	s.txns.abortAllBut(fmt.Sprintf("%s-%d-", oc.UID, oc.Subtask), keep)
	return nil
}

// CommitRestored implements runtime.RestoreCommitter.
func (s *txnSink) CommitRestored(_ context.Context, oc *runtime.OperatorContext) error {
	for _, h := range append(slices.Clone(oc.CommitHandles), oc.OrphanHandles...) {
		s.txns.commit(h.TransactionalID)
	}
	return nil
}

func (s *txnSink) Write(_ context.Context, v rec) error {
	s.cur = append(s.cur, v)
	return nil
}

func (s *txnSink) Snapshot(_ context.Context, id checkpoint.ID) (runtime.OperatorState, error) {
	if len(s.cur) > 0 {
		h := checkpoint.TxnHandle{TransactionalID: fmt.Sprintf("%s-%d-%d", s.oc.UID, s.oc.Subtask, id), Checkpoint: id}
		s.txns.put(h.TransactionalID, s.cur)
		s.cur = nil
		s.pending = append(s.pending, h)
	}
	return runtime.OperatorState{Handles: slices.Clone(s.pending)}, nil
}

func (s *txnSink) NotifyCheckpointComplete(_ context.Context, id checkpoint.ID) error {
	var rest []checkpoint.TxnHandle
	for _, h := range s.pending {
		if h.Checkpoint <= id {
			s.txns.commit(h.TransactionalID)
		} else {
			rest = append(rest, h)
		}
	}
	s.pending = rest
	return nil
}

func (s *txnSink) NotifyCheckpointAborted(context.Context, checkpoint.ID) error { return nil }

// CarriesAbortedCheckpoints implements checkpoint.AbortCarrier.
func (s *txnSink) CarriesAbortedCheckpoints() {}

func (s *txnSink) Close() error { return nil }

// cluster is a job manager and task managers in this process.
type cluster struct {
	t      *testing.T
	srv    *jobmanager.Server
	addr   string
	reg    *runtime.Registry
	log    *zap.Logger
	tmOpts []taskmanager.Opt
	wg     sync.WaitGroup
	tms    map[string]context.CancelFunc
}

// startCluster starts a job manager with jmOpts added; its task managers
// (startTM) get tmOpts added.
func startCluster(t *testing.T, reg *runtime.Registry, log *zap.Logger, jmOpts []jobmanager.Opt, tmOpts ...taskmanager.Opt) *cluster {
	t.Helper()
	// A generous heartbeat timeout: the test box is loaded, and a session
	// lost to a late heartbeat is not what this package tests.
	// And Flink's checkpoint timeout: under the race detector on a loaded
	// machine a 64 MiB checkpoint can take longer than Weir's default
	// minute, and then every one of them expires.
	srv, err := jobmanager.New(append([]jobmanager.Opt{jobmanager.Jobs(reg), jobmanager.DataDir(t.TempDir()), jobmanager.Logger(log.Named("jm")),
		jobmanager.HeartbeatTimeout(30 * time.Second), jobmanager.CheckpointTimeout(10 * time.Minute)}, jmOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, srv: srv, addr: lis.Addr().String(), reg: reg, log: log, tmOpts: tmOpts, tms: map[string]context.CancelFunc{}}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		for _, cancel := range c.tms {
			cancel()
		}
		c.wg.Wait()
		stop()
		if err := <-served; err != nil {
			t.Errorf("job manager: %v", err)
		}
		if err := srv.Close(); err != nil {
			t.Errorf("job manager close: %v", err)
		}
	})
	return c
}

// startTM starts task manager id with one slot.
func (c *cluster) startTM(id string) {
	ctx, cancel := context.WithCancel(context.Background())
	c.tms[id] = cancel
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		err := taskmanager.Run(ctx, c.addr, append([]taskmanager.Opt{taskmanager.ID(id), taskmanager.Slots(1), taskmanager.Jobs(c.reg),
			taskmanager.Logger(c.log.Named(id)), taskmanager.ReconnectDelay(50 * time.Millisecond)}, c.tmOpts...)...)
		if err != nil && ctx.Err() == nil {
			c.t.Errorf("task manager %s: %v", id, err)
		}
	}()
}

// stopTM stops task manager id (as SIGTERM does): its session and tasks end.
func (c *cluster) stopTM(id string) {
	c.tms[id]()
	delete(c.tms, id)
}

// waitUntil polls cond every 20ms until it holds, failing the test after
// within.
func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkRounds asserts that the committed output holds, per key, exactly
// rounds 1..n in order, for every key.
func checkRounds(t *testing.T, out []rec, keys, n int) {
	t.Helper()
	next := map[string]int64{}
	for _, r := range out {
		if r.Round != next[r.Key]+1 {
			t.Fatalf("key %s: committed round %d after %d (duplicate or loss)", r.Key, r.Round, next[r.Key])
		}
		next[r.Key] = r.Round
	}
	if len(next) != keys {
		t.Fatalf("committed output has %d keys, want %d", len(next), keys)
	}
	for k, last := range next {
		if last != int64(n) {
			t.Fatalf("key %s: last committed round %d, want %d", k, last, n)
		}
	}
	if len(out) != keys*n {
		t.Fatalf("committed %d records, want %d", len(out), keys*n)
	}
}

// bigStateMiB is the keyed state size WEIR_BIG_STATE asks for: 1 means
// 1 GiB, N > 1 N MiB; def MiB without it.
func bigStateMiB(t *testing.T, def int) int {
	switch v := os.Getenv("WEIR_BIG_STATE"); v {
	case "":
		return def
	case "1":
		return 1 << 10
	default:
		mib, err := strconv.Atoi(v)
		if err != nil || mib < 1 {
			t.Fatalf("WEIR_BIG_STATE=%q: want 1 (1 GiB) or a number of MiB", v)
		}
		return mib
	}
}

// runBigState runs the big-state job with mib MiB of keyed state (16 KiB
// per key) on c, on task managers tm-1 and tm-2: both rounds before the
// pause are checkpointed (full, holding the state of every key, and next,
// the checkpoint after it, taken while the job is still paused), check
// judges them, then tm-1 stops as a crash would, tm-3 starts, the job
// restores every byte of state and finishes with every record committed
// once.
func runBigState(t *testing.T, c *cluster, j *bigJob, check func(full, next checkpoint.Completed)) {
	t.Helper()
	// Each wait is generous: a GiB of state takes minutes per checkpoint
	// and restore on a loaded 2-core machine.
	wait := 5 * time.Minute
	if j.keys > 4096 {
		wait = 30 * time.Minute
	}
	c.startTM("tm-1")
	c.startTM("tm-2")
	waitUntil(t, time.Minute, "two task managers registered", func() bool { return len(c.srv.TaskManagers()) == 2 })

	ctx := t.Context()
	id, err := c.srv.Submit(ctx, "bigstate", nil, time.Second, "fixed-delay:attempts=3,delay=100ms")
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, wait, "both sources paused after round 2", func() bool { return j.paused.Load() == 2 })
	_, paused, err := c.srv.Job(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	// Checkpoint paused+2 was triggered after the sources paused: it holds
	// the state of two whole rounds.
	start := time.Now()
	completedAfter := func(after checkpoint.ID) checkpoint.Completed {
		t.Helper()
		waitUntil(t, wait, fmt.Sprintf("a checkpoint of the paused job after %d", after), func() bool {
			rec, last, err := c.srv.Job(ctx, id)
			if rec.State == jobmanager.StateFailed {
				t.Fatalf("job failed: %s", rec.Error)
			}
			return err == nil && last > after
		})
		cp, err := c.srv.LatestCheckpoint(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return cp
	}
	full := completedAfter(paused + 1)
	if want := int64(j.keys * j.pad); full.Size() < want {
		t.Fatalf("checkpoint %d holds %d bytes of state; want at least %d", full.ID, full.Size(), want)
	}
	t.Logf("checkpoint %d: %d MiB of state, completed %v after its trigger; two checkpoints in %v", full.ID, full.Size()>>20,
		full.CompletedAt.Sub(full.TriggeredAt).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	next := completedAfter(full.ID)
	check(full, next)

	c.stopTM("tm-1")
	c.startTM("tm-3")
	restoring := time.Now()
	waitUntil(t, wait, "the job restarted", func() bool {
		rec, _, err := c.srv.Job(ctx, id)
		if rec.State == jobmanager.StateFailed {
			t.Fatalf("job failed: %s", rec.Error)
		}
		return err == nil && rec.Restarts >= 1 && rec.State == jobmanager.StateRunning && rec.RestoredFrom >= full.ID
	})
	t.Logf("restored checkpoint >= %d and running again after %v", full.ID, time.Since(restoring).Round(time.Millisecond))
	close(j.resume)
	resumed := time.Now()
	var rec jobmanager.JobRecord
	waitUntil(t, wait, "the job finished", func() bool {
		rec, _, err = c.srv.Job(ctx, id)
		return err == nil && (rec.State == jobmanager.StateFinished || rec.State == jobmanager.StateFailed)
	})
	if rec.State != jobmanager.StateFinished {
		t.Fatalf("job %s: %s", rec.State, rec.Error)
	}
	if v := j.viol.get(); len(v) > 0 {
		sort.Strings(v)
		t.Fatalf("restored keyed state is not the checkpointed state: %d violations, first: %s", len(v), v[0])
	}
	checkRounds(t, j.txns.output(), j.keys, j.rounds)
	t.Logf("restarts=%d; rounds 3-4 and the final checkpoint took %v", rec.Restarts, time.Since(resumed).Round(time.Millisecond))
}

// newBigJob is the big-state job with mib MiB of keyed state, registered
// in a new registry.
func newBigJob(t *testing.T, mib int) (*bigJob, *runtime.Registry) {
	const pad = 16 << 10
	j := &bigJob{keys: mib << 20 / pad, rounds: 4, pause: 2, pad: pad, resume: make(chan struct{}),
		txns: &memTxns{open: map[string][]rec{}}}
	reg := runtime.NewRegistry()
	j.register(t, reg)
	return j, reg
}

// A job whose keyed state is far above gRPC's 4 MiB message limit
// checkpoints on a cluster of two task managers (the snapshots travel to
// the job manager in chunks), loses a task manager, restores every byte of
// that state on a new one (in chunks too) and finishes with every record
// committed once. WEIR_BIG_STATE=1 runs it with 1 GiB of state,
// WEIR_BIG_STATE=N with N MiB (64 MiB by default; 16 MiB, still four times
// the limit, under the race detector, which takes minutes per 64 MiB
// checkpoint through the control stream: .ci/run runs it at 64 MiB without).
func TestStateFarAboveTheMessageLimitCheckpointsAndRestoresOnACluster(t *testing.T) {
	mib := 64
	if raceEnabled {
		mib = 16
	}
	j, reg := newBigJob(t, bigStateMiB(t, mib))
	c := startCluster(t, reg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), nil)
	runBigState(t, c, j, func(full, next checkpoint.Completed) {})
}

// The same job with its keyed state on object storage (the embedded S3
// server, through the AWS client): the task managers write the state there
// and the job manager keeps references only (less than 1 MiB of the
// checkpoint inline), the checkpoint after the full one, with no key
// changed, uploads less than 1 MiB (incremental), and the task manager
// that replaces a lost one restores every byte from S3. 256 MiB of keyed
// state by default, 32 MiB under the race detector (WEIR_BIG_STATE sets it
// as above); .ci/run runs it without the race detector too.
func TestHundredsOfMBOfKeyedStateCheckpointToS3IncrementallyAndRestore(t *testing.T) {
	mib := 256
	if raceEnabled {
		mib = 32
	}
	j, reg := newBigJob(t, bigStateMiB(t, mib))
	srv, err := s3server.Start(t.Context(), s3server.Buckets("weir"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	u, creds := srv.URL("weir", "cp"), storage.Credentials("weir", "weir")
	c := startCluster(t, reg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
		[]jobmanager.Opt{jobmanager.CheckpointStorage(u, creds)}, taskmanager.CheckpointStorage(u, creds))
	runBigState(t, c, j, func(full, next checkpoint.Completed) {
		var referenced int64
		for _, r := range full.Refs() {
			referenced += r.Length
		}
		if inline := full.Size() - referenced; inline >= 1<<20 {
			t.Fatalf("checkpoint %d holds %d bytes inline of %d: the state did not go to S3", full.ID, inline, full.Size())
		}
		if next.Size() < full.Size() || next.Uploaded() >= 1<<20 {
			t.Fatalf("checkpoint %d of the paused job: %d bytes of state, %d uploaded; want at least %d, less than 1 MiB uploaded",
				next.ID, next.Size(), next.Uploaded(), full.Size())
		}
		t.Logf("checkpoint %d: %d MiB on S3, %d bytes inline; checkpoint %d uploaded %d bytes", full.ID, referenced>>20,
			full.Size()-referenced, next.ID, next.Uploaded())
	})
}
