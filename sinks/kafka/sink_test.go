package kafka

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/internal/kafkatxn"
	"github.com/weirstream/weir/runtime"
)

// numbered is the i-th record of a job's input: the seq-th record of key.
type numbered struct {
	Key string
	Seq int
}

// numberedKeys is the number of keys of numberedItems; a multiple of every
// parallelism the tests use, so all records of a key come from one source
// subtask (SliceSource gives subtask s the items i with i%p == s) and keep
// their order on the way to the sink.
const numberedKeys = 8

// numberedItems returns n records, key i%numberedKeys, seq i/numberedKeys+1.
func numberedItems(n int) []numbered {
	out := make([]numbered, n)
	for i := range out {
		out[i] = numbered{Key: fmt.Sprintf("k%d", i%numberedKeys), Seq: i/numberedKeys + 1}
	}
	return out
}

// serializeTo writes a record keyed by its key (so partitioned by key),
// valued by its sequence number.
func serializeTo(topic string) func(numbered) (*kgo.Record, error) {
	return func(n numbered) (*kgo.Record, error) {
		return &kgo.Record{Topic: topic, Key: []byte(n.Key), Value: strconv.AppendInt(nil, int64(n.Seq), 10)}, nil
	}
}

// Shapes of the test job between the source and the sink.
const (
	shapeDirect = iota // source -> sink, chained
	shapeMap           // source -> map -> sink, chained
	shapeKeyed         // source -> keyBy -> process -> sink (a network shuffle, aligned barriers)
	numShapes
)

// pacedSource sleeps before every poll, so that a job over a few hundred
// records spans several checkpoints.
type pacedSource[T any] struct {
	runtime.Source[T]
	pause time.Duration
}

func (p pacedSource[T]) Poll(ctx context.Context, out runtime.Collector[T]) error {
	time.Sleep(p.pause)
	return p.Source.Poll(ctx, out)
}

// numberedJob builds SliceSource(items, perPoll records a millisecond) ->
// shape -> Kafka sink.
func numberedJob(t testing.TB, name string, items []numbered, perPoll, par, shape int, newSink func() runtime.Sink[numbered]) *runtime.Job {
	t.Helper()
	j := runtime.NewJob(name, runtime.DefaultParallelism(par))
	slice := runtime.SliceSource(items, perPoll)
	s := runtime.FromSource(j, "numbers", func() runtime.Source[numbered] {
		return pacedSource[numbered]{Source: slice(), pause: time.Millisecond}
	})
	switch shape {
	case shapeMap:
		s = runtime.Map(s, "map", func(n numbered) (numbered, error) { return n, nil })
	case shapeKeyed:
		s = runtime.Process(runtime.KeyBy(s, func(n numbered) string { return n.Key }, nil), "by-key",
			func() runtime.KeyedProcessFunction[string, numbered, numbered] {
				return runtime.ProcessFunc[string, numbered, numbered](func(_ string, v numbered, out runtime.Collector[numbered]) error {
					out.Collect(v)
					return nil
				})
			})
	}
	runtime.SinkTo(s, "kafka", newSink)
	return j
}

func newNumberedSink(t testing.TB, addr, topic string, opts ...Opt) func() runtime.Sink[numbered] {
	t.Helper()
	f, err := NewSink(serializeTo(topic), append([]Opt{Brokers(addr)}, opts...))
	if err != nil {
		t.Fatalf("NewSink: %v", err)
	}
	return f
}

// checkExactlyOnce asserts that recs (read_committed, partition then offset
// order) hold exactly the n records of numberedItems(n): for every key the
// values 1, 2, ..., in order, each once, and nothing else.
func checkExactlyOnce(t *testing.T, recs []*kgo.Record, n int) {
	t.Helper()
	next := map[string]int{}
	part := map[string]int32{}
	for _, r := range recs {
		k := string(r.Key)
		seq, err := strconv.Atoi(string(r.Value))
		if err != nil {
			t.Fatalf("%s[%d]@%d: value %q is not a number", r.Topic, r.Partition, r.Offset, r.Value)
		}
		if p, ok := part[k]; ok && p != r.Partition {
			t.Fatalf("key %s in partitions %d and %d", k, p, r.Partition)
		}
		part[k] = r.Partition
		if seq != next[k]+1 {
			t.Fatalf("key %s: committed %d after %d at %s[%d]@%d (%s)", k, seq, next[k], r.Topic, r.Partition, r.Offset,
				map[bool]string{true: "duplicate", false: "loss"}[seq <= next[k]])
		}
		next[k] = seq
	}
	for i, want := range wantPerKey(n) {
		if k := fmt.Sprintf("k%d", i); next[k] != want {
			t.Fatalf("key %s: last committed %d, want %d (loss)", k, next[k], want)
		}
	}
	if len(recs) != n {
		t.Fatalf("read %d committed records, want %d", len(recs), n)
	}
}

func wantPerKey(n int) []int {
	out := make([]int, numberedKeys)
	for i := range n {
		out[i%numberedKeys]++
	}
	return out
}

// openTxnPartitions returns the partitions of topic whose last stable
// offset is below the high watermark: a transaction is open on them.
func openTxnPartitions(ctx context.Context, adm *kadm.Client, topic string) ([]int32, error) {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	stable, err := adm.ListCommittedOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	var open []int32
	var lerr error
	ends.Each(func(o kadm.ListedOffset) {
		s, ok := stable.Lookup(topic, o.Partition)
		switch {
		case !ok || s.Err != nil || o.Err != nil:
			lerr = fmt.Errorf("partition %d: no offsets (%v, %v)", o.Partition, o.Err, s.Err)
		case s.Offset < o.Offset:
			open = append(open, o.Partition)
		}
	})
	return open, lerr
}

func requireNoOpenTxn(t *testing.T, ctx context.Context, adm *kadm.Client, topic string) {
	t.Helper()
	open, err := openTxnPartitions(ctx, adm, topic)
	if err != nil {
		t.Fatalf("list offsets of %s: %v", topic, err)
	}
	if len(open) > 0 {
		t.Fatalf("partitions %v of %s: last stable offset below the high watermark, a transaction lingers", open, topic)
	}
}

// ongoingTxns lists the ongoing transactions whose ids start with prefix.
func ongoingTxns(ctx context.Context, adm *kadm.Client, prefix string) ([]string, error) {
	l, err := adm.ListTransactions(ctx, nil, []string{"Ongoing"})
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, tx := range l.Sorted() {
		if strings.HasPrefix(tx.TxnID, prefix) && tx.State == "Ongoing" {
			ids = append(ids, tx.TxnID)
		}
	}
	return ids, nil
}

var errCrash = errors.New("injected crash")

// failurePlan fails named failpoints once each time their hit count
// reaches one of the planned thresholds.
type failurePlan struct {
	mu    sync.Mutex
	at    map[string][]int64 // ascending thresholds still to fire
	hits  map[string]int64
	fired map[string]int
}

func (p *failurePlan) add(name string, hit int64) {
	p.at[name] = append(p.at[name], hit)
	for i := len(p.at[name]) - 1; i > 0 && p.at[name][i] < p.at[name][i-1]; i-- {
		p.at[name][i], p.at[name][i-1] = p.at[name][i-1], p.at[name][i]
	}
}

func (p *failurePlan) hook(name string) failpoint.Option {
	return failpoint.WithHook(name, func() error {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.hits[name]++
		if th := p.at[name]; len(th) > 0 && p.hits[name] >= th[0] {
			p.at[name] = th[1:]
			p.fired[name]++
			return errCrash
		}
		return nil
	})
}

func (p *failurePlan) total() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.fired {
		n += c
	}
	return n
}

var crashPoints = []string{
	failpoint.SinkAfterPrecommit,
	failpoint.SinkAfterCommit,
	failpoint.JMAfterCheckpointPersisted,
	failpoint.TaskProcess,
}

// TestSinkExactlyOnceUnderInjectedCrashes runs SliceSource -> (map | keyBy)
// -> Kafka sink in the mini cluster with random shapes, parallelism,
// checkpoint intervals and in-process crashes at sink.after-precommit,
// sink.after-commit, jm.after-checkpoint-persisted and task.process; every
// crash restarts the job from its latest completed checkpoint. A
// read_committed reader must then see every record exactly once, in order
// per key, and no transaction may be left open.
func TestSinkExactlyOnceUnderInjectedCrashes(t *testing.T) {
	env := kafkatest.New(t)
	adm := env.Admin(t)
	seeds := 16
	if testing.Short() {
		seeds = 6
	}
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(seed), 7))
			n := 400 + rng.IntN(1200)
			par, shape := 1+rng.IntN(2), rng.IntN(numShapes)
			plan := &failurePlan{at: map[string][]int64{}, hits: map[string]int64{}, fired: map[string]int{}}
			for f := range 1 + rng.IntN(3) {
				name := crashPoints[rng.IntN(len(crashPoints))]
				if f == 0 {
					name = crashPoints[seed%len(crashPoints)] // every point in turn
				}
				hit := int64(1 + rng.IntN(3))
				if name == failpoint.TaskProcess {
					hit = int64(1 + rng.IntN(n))
				}
				plan.add(name, hit)
			}
			var fpOpts []failpoint.Option
			for _, name := range crashPoints {
				fpOpts = append(fpOpts, plan.hook(name))
			}
			topic := fmt.Sprintf("crash-%d", seed)
			env.CreateTopic(t, topic, 3, nil)
			job := numberedJob(t, topic, numberedItems(n), 1+rng.IntN(24), par, shape, newNumberedSink(t, env.Addr, topic))
			mc := runtime.NewMiniCluster(
				runtime.CheckpointInterval(time.Duration(2+rng.IntN(12))*time.Millisecond),
				runtime.Failpoints(failpoint.New(fpOpts...)),
				runtime.Restarts(20, time.Millisecond),
			)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := mc.Run(ctx, job)
			if err != nil {
				t.Fatalf("job failed: %v (failpoints fired %v)", err, plan.fired)
			}
			if plan.total() == 0 || res.Restarts == 0 {
				t.Fatalf("no injected crash took effect (fired %v, hits %v, plan %v, restarts %d, last %d): the test proved nothing", plan.fired, plan.hits, plan.at, res.Restarts, res.LastCheckpoint)
			}
			checkExactlyOnce(t, env.ReadCommitted(t, topic), n)
			requireNoOpenTxn(t, ctx, adm, topic)
			t.Logf("n=%d par=%d shape=%d restarts=%d last checkpoint=%d fired=%v", n, par, shape, res.Restarts, res.LastCheckpoint, plan.fired)
		})
	}
}

// TestSinkFailpointsFireWhereTheContractSays checks, from inside the hooks,
// that sink.after-precommit fires while the flushed transaction is still
// open (its records written, not yet visible to read_committed) and that
// sink.after-commit fires after the commit returned (each time, more
// records are visible than the time before).
func TestSinkFailpointsFireWhereTheContractSays(t *testing.T) {
	env := kafkatest.New(t)
	adm := env.Admin(t)
	const topic, n = "where", 400
	env.CreateTopic(t, topic, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var (
		mu               sync.Mutex
		precommitsOpen   int // after-precommit hits with a pre-committed transaction
		visibleAtCommits []int
		problems         []string
	)
	afterPrecommit := func() error {
		ids, err := ongoingTxns(ctx, adm, "weir-"+topic+"-kafka-")
		if err != nil {
			return err
		}
		if len(ids) == 0 {
			return nil // an empty epoch: nothing pre-committed
		}
		open, err := openTxnPartitions(ctx, adm, topic)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		precommitsOpen++
		if len(open) == 0 {
			problems = append(problems, fmt.Sprintf("after-precommit: transactions %v ongoing but no partition holds uncommitted records: not flushed", ids))
		}
		return nil
	}
	afterCommit := func() error {
		recs, err := kafkatest.ReadCommitted(ctx, []string{env.Addr}, topic)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if k := len(visibleAtCommits); k > 0 && len(recs) <= visibleAtCommits[k-1] {
			problems = append(problems, fmt.Sprintf("after-commit: %d records visible, %d at the previous commit: the commit had not taken effect", len(recs), visibleAtCommits[k-1]))
		}
		visibleAtCommits = append(visibleAtCommits, len(recs))
		return nil
	}
	fp := failpoint.New(failpoint.WithHook(failpoint.SinkAfterPrecommit, afterPrecommit),
		failpoint.WithHook(failpoint.SinkAfterCommit, afterCommit))
	job := numberedJob(t, topic, numberedItems(n), 8, 1, shapeDirect, newNumberedSink(t, env.Addr, topic))
	mc := runtime.NewMiniCluster(runtime.CheckpointInterval(5*time.Millisecond), runtime.Failpoints(fp), runtime.Restarts(0, 0))
	if _, err := mc.Run(ctx, job); err != nil {
		t.Fatal(err)
	}
	if len(problems) > 0 {
		t.Fatalf("failpoints fired in the wrong place: %s", strings.Join(problems, "; "))
	}
	if precommitsOpen == 0 || len(visibleAtCommits) == 0 {
		t.Fatalf("hooks saw %d pre-committed transactions and %d commits, want some of each", precommitsOpen, len(visibleAtCommits))
	}
	if got := visibleAtCommits[len(visibleAtCommits)-1]; got != n {
		t.Fatalf("after the last commit %d records were visible, want %d", got, n)
	}
	checkExactlyOnce(t, env.ReadCommitted(t, topic), n)
}

// TestSinkSurvivesBrokerRestartBetweenPrecommitAndCommit restarts the
// broker (same port, persistent data dir) right after the sink pre-committed
// a transaction, before its checkpoint completes: the pending transaction
// survives the restart and is committed; no record is lost or repeated.
func TestSinkSurvivesBrokerRestartBetweenPrecommitAndCommit(t *testing.T) {
	dir := t.TempDir()
	env := kafkatest.New(t, broker.DataDir(dir))
	adm := env.Admin(t)
	const topic, n = "restart", 600
	env.CreateTopic(t, topic, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var (
		mu       sync.Mutex
		current  = env.Broker
		restarts int
	)
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		if err := current.Close(); err != nil {
			t.Errorf("close restarted broker: %v", err)
		}
	})
	restart := func() error {
		mu.Lock()
		defer mu.Unlock()
		if restarts == 2 {
			return nil
		}
		ids, err := ongoingTxns(ctx, adm, "weir-"+topic+"-kafka-")
		if err != nil || len(ids) == 0 {
			return err // restart only with a pre-committed transaction pending
		}
		if err := current.Close(); err != nil {
			return fmt.Errorf("close broker: %w", err)
		}
		b, err := broker.Start(ctx, broker.Listen(env.Addr), broker.DataDir(dir))
		if err != nil {
			return fmt.Errorf("restart broker: %w", err)
		}
		current = b
		restarts++
		return nil
	}
	fp := failpoint.New(failpoint.WithHook(failpoint.SinkAfterPrecommit, restart))
	job := numberedJob(t, topic, numberedItems(n), 4, 1, shapeMap, newNumberedSink(t, env.Addr, topic))
	mc := runtime.NewMiniCluster(runtime.CheckpointInterval(10*time.Millisecond), runtime.Failpoints(fp), runtime.Restarts(5, 10*time.Millisecond))
	res, err := mc.Run(ctx, job)
	if err != nil {
		t.Fatalf("job failed: %v", err)
	}
	if restarts == 0 {
		t.Fatal("the broker was never restarted with a pre-committed transaction pending")
	}
	checkExactlyOnce(t, env.ReadCommitted(t, topic), n)
	requireNoOpenTxn(t, ctx, adm, topic)
	t.Logf("broker restarts=%d job restarts=%d", restarts, res.Restarts)
}

// TestSinkAbortsLingeringTransactions covers the two ways a transaction is
// left open by an attempt that died: (1) a previous process of the job was
// killed with a transaction open (simulated by a producer on one of the
// sink's transactional ids that never ends its transaction), pinning the
// last stable offset; (2) an attempt crashes right after pre-committing, so
// its pre-committed transaction belongs to no completed checkpoint. Either
// way the recovering sink must abort it: the last stable offset advances
// and a read_committed reader sees the later data, and only that.
func TestSinkAbortsLingeringTransactions(t *testing.T) {
	env := kafkatest.New(t)
	adm := env.Admin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 300

	t.Run("killed previous process", func(t *testing.T) {
		const topic = "linger-killed"
		env.CreateTopic(t, topic, 3, nil)
		zombie, err := kgo.NewClient(kgo.SeedBrokers(env.Addr), kgo.TransactionalID(kafkatxn.TransactionalID("weir-"+topic+"-kafka", 0, 3)),
			kgo.TransactionTimeout(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if err := zombie.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := zombie.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("k0"), Value: []byte("zombie")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		zombie.Close() // no EndTxn: the transaction stays open, as after a SIGKILL
		if open, err := openTxnPartitions(ctx, adm, topic); err != nil || len(open) != 1 {
			t.Fatalf("setup: want one partition pinned by the zombie transaction, got %v (%v)", open, err)
		}

		job := numberedJob(t, topic, numberedItems(n), 16, 1, shapeDirect, newNumberedSink(t, env.Addr, topic))
		if _, err := runtime.NewMiniCluster(runtime.CheckpointInterval(5*time.Millisecond), runtime.Restarts(0, 0)).Run(ctx, job); err != nil {
			t.Fatal(err)
		}
		checkExactlyOnce(t, env.ReadCommitted(t, topic), n) // the zombie's record is not among them
		requireNoOpenTxn(t, ctx, adm, topic)
	})

	t.Run("attempt crashed after pre-commit", func(t *testing.T) {
		const topic = "linger-crashed"
		env.CreateTopic(t, topic, 3, nil)
		var (
			mu      sync.Mutex
			crashed bool
			pinned  []int32
		)
		crashOnce := func() error {
			mu.Lock()
			defer mu.Unlock()
			if crashed {
				return nil
			}
			open, err := openTxnPartitions(ctx, adm, topic)
			if err != nil || len(open) == 0 {
				return err // wait for an epoch with records
			}
			crashed, pinned = true, open
			return errCrash
		}
		fp := failpoint.New(failpoint.WithHook(failpoint.SinkAfterPrecommit, crashOnce))
		job := numberedJob(t, topic, numberedItems(n), 4, 1, shapeMap, newNumberedSink(t, env.Addr, topic))
		res, err := runtime.NewMiniCluster(runtime.CheckpointInterval(5*time.Millisecond), runtime.Failpoints(fp),
			runtime.Restarts(3, time.Millisecond)).Run(ctx, job)
		if err != nil {
			t.Fatal(err)
		}
		if !crashed || res.Restarts != 1 {
			t.Fatalf("crashed=%v restarts=%d, want one crash with a pre-committed transaction pinning %v", crashed, res.Restarts, pinned)
		}
		checkExactlyOnce(t, env.ReadCommitted(t, topic), n)
		requireNoOpenTxn(t, ctx, adm, topic)
	})
}

// TestSinkRefusesTransactionTimeoutTheBrokerCannotHonour: a transaction
// timeout above the broker's transaction.max.timeout.ms fails the job at
// the sink's Open with a clear error (ErrInvalidConfig), before anything is
// written; with CheckpointTimeouts, a transaction timeout not exceeding
// checkpoint timeout + restart budget is refused by NewSink already.
func TestSinkRefusesTransactionTimeoutTheBrokerCannotHonour(t *testing.T) {
	env := kafkatest.New(t, broker.Config("transaction.max.timeout.ms", "60000"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("at open", func(t *testing.T) {
		cases := []struct {
			name  string
			sopts []SinkOpt
		}{
			{"broker maximum only", nil},
			{"with checkpoint timeouts", []SinkOpt{CheckpointTimeouts(30*time.Second, 10*time.Second)}},
		}
		for i, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				topic := fmt.Sprintf("too-long-%d", i)
				env.CreateTopic(t, topic, 1, nil)
				f, err := NewSink(serializeTo(topic), []Opt{Brokers(env.Addr), TransactionTimeout(2 * time.Minute)}, tc.sopts...)
				if err != nil {
					t.Fatalf("NewSink: %v", err)
				}
				job := numberedJob(t, topic, numberedItems(10), 0, 1, shapeDirect, f)
				// Default restart budget: a configuration error must fail
				// the job at once, not be retried.
				res, err := runtime.NewMiniCluster().Run(ctx, job)
				if !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, runtime.ErrJobFailed) || !errors.Is(err, runtime.ErrUnrecoverable) ||
					!strings.Contains(err.Error(), "transaction.max.timeout.ms") {
					t.Fatalf("Run = %v, want an unrecoverable job failure wrapping ErrInvalidConfig about transaction.max.timeout.ms", err)
				}
				if res.Restarts != 0 {
					t.Fatalf("a configuration error was retried %d times", res.Restarts)
				}
				if recs := env.ReadCommitted(t, topic); len(recs) != 0 {
					t.Fatalf("a refused job committed %d records", len(recs))
				}
			})
		}
	})

	t.Run("at build", func(t *testing.T) {
		cases := []struct {
			name    string
			opts    []Opt
			sopts   []SinkOpt
			wantErr string
		}{
			{"shorter than checkpoint timeout + restart budget", []Opt{TransactionTimeout(2 * time.Minute)},
				[]SinkOpt{CheckpointTimeouts(time.Minute, time.Minute)}, "must exceed checkpoint timeout"},
			{"non-positive checkpoint timeout", nil, []SinkOpt{CheckpointTimeouts(0, time.Minute)}, "must be positive"},
			{"long enough", []Opt{TransactionTimeout(5 * time.Minute)}, []SinkOpt{CheckpointTimeouts(time.Minute, time.Minute)}, ""},
			{"not checked without transactions", []Opt{Guarantee(AtLeastOnce), TransactionTimeout(time.Minute)},
				[]SinkOpt{CheckpointTimeouts(time.Minute, time.Minute)}, ""},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				_, err := NewSink(serializeTo("x"), append([]Opt{Brokers(env.Addr)}, tc.opts...), tc.sopts...)
				if tc.wantErr == "" {
					if err != nil {
						t.Fatalf("NewSink = %v, want nil", err)
					}
					return
				}
				if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("NewSink = %v, want ErrInvalidConfig mentioning %q", err, tc.wantErr)
				}
			})
		}
	})
}

// TestSinkEmptyEpochCommitsNothing drives one sink subtask by hand: an
// epoch without records pre-commits no transaction (the snapshot names
// none), initialises no producer, and writes nothing to the topic, not
// even a transaction marker; an epoch with records commits them.
func TestSinkEmptyEpochCommitsNothing(t *testing.T) {
	env := kafkatest.New(t)
	adm := env.Admin(t)
	const topic = "empty"
	env.CreateTopic(t, topic, 1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := newNumberedSink(t, env.Addr, topic)
	s := f()
	if err := s.Open(ctx, &runtime.OperatorContext{Job: "empty", UID: "kafka", Parallelism: 1}); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := s.(checkpoint.Listener)
	hwm := func() int64 {
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		o, _ := ends.Lookup(topic, 0)
		return o.Offset
	}
	epoch := func(id checkpoint.ID, records int) []checkpoint.TxnHandle {
		for i := range records {
			if err := s.Write(ctx, numbered{Key: "k0", Seq: i + 1}); err != nil {
				t.Fatal(err)
			}
		}
		st, err := s.Snapshot(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.NotifyCheckpointComplete(ctx, id); err != nil {
			t.Fatal(err)
		}
		return st.Handles
	}

	if hs := epoch(1, 0); len(hs) != 0 || hwm() != 0 {
		t.Fatalf("empty first epoch: snapshot names %v, high watermark %d; want nothing", hs, hwm())
	}
	if l, err := adm.ListTransactions(ctx, nil, nil); err != nil || len(l) != 0 {
		t.Fatalf("an empty epoch initialised transactional ids %v (%v)", l.TransactionalIDs(), err)
	}
	if hs := epoch(2, 3); len(hs) != 1 || hs[0].Checkpoint != 2 {
		t.Fatalf("epoch with records: snapshot names %v, want one transaction of checkpoint 2", hs)
	}
	after := hwm()
	if hs := epoch(3, 0); len(hs) != 0 || hwm() != after {
		t.Fatalf("empty epoch after data: snapshot names %v, high watermark %d -> %d; want nothing written", hs, after, hwm())
	}
	checkRecs := env.ReadCommitted(t, topic)
	if len(checkRecs) != 3 {
		t.Fatalf("read %d committed records, want 3", len(checkRecs))
	}
}

// TestSinkWithoutTransactions: at-least-once loses nothing across a crash
// (records may repeat); none delivers everything on a clean finish (Close
// flushes what the client still buffers).
func TestSinkWithoutTransactions(t *testing.T) {
	env := kafkatest.New(t)
	const n = 500
	cases := []struct {
		name      string
		guarantee DeliveryGuarantee
		crashAt   int64 // task.process hit that crashes the job once; 0: none
	}{
		{"at-least-once across a crash", AtLeastOnce, n / 2},
		{"none on a clean finish", None, 0},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			topic := fmt.Sprintf("plain-%d", i)
			env.CreateTopic(t, topic, 3, nil)
			plan := &failurePlan{at: map[string][]int64{}, hits: map[string]int64{}, fired: map[string]int{}}
			if tc.crashAt > 0 {
				plan.add(failpoint.TaskProcess, tc.crashAt)
			}
			job := numberedJob(t, topic, numberedItems(n), 16, 1, shapeDirect,
				newNumberedSink(t, env.Addr, topic, Guarantee(tc.guarantee)))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := runtime.NewMiniCluster(runtime.CheckpointInterval(5*time.Millisecond),
				runtime.Failpoints(failpoint.New(plan.hook(failpoint.TaskProcess))), runtime.Restarts(3, time.Millisecond)).Run(ctx, job)
			if err != nil {
				t.Fatal(err)
			}
			if tc.crashAt > 0 && res.Restarts != 1 {
				t.Fatalf("restarts = %d, want 1", res.Restarts)
			}
			seen := map[string]map[int]bool{}
			recs := env.ReadCommitted(t, topic)
			for _, r := range recs {
				k := string(r.Key)
				if seen[k] == nil {
					seen[k] = map[int]bool{}
				}
				seq, _ := strconv.Atoi(string(r.Value))
				seen[k][seq] = true
			}
			for i, want := range wantPerKey(n) {
				k := fmt.Sprintf("k%d", i)
				for seq := 1; seq <= want; seq++ {
					if !seen[k][seq] {
						t.Fatalf("key %s: record %d lost (%d records read)", k, seq, len(recs))
					}
				}
			}
			if tc.crashAt == 0 && len(recs) != n {
				t.Fatalf("read %d records, want %d", len(recs), n)
			}
		})
	}
}

// TestSinkChecksTransactionTimeoutAgainstTheJobsCheckpointTiming: without
// any sink option, a transaction timeout that a pre-committed transaction
// could outlive under the executor's checkpoint configuration (interval,
// timeout, tolerated failures, restart budget) fails the job at start with
// a clear, unrecoverable error, before a record is written; one that
// covers it runs.
func TestSinkChecksTransactionTimeoutAgainstTheJobsCheckpointTiming(t *testing.T) {
	env := kafkatest.New(t)
	cases := []struct {
		name   string
		copts  []runtime.ClusterOpt
		refuse bool
	}{
		// 4 x (1s + 30s) + 100ms + 30s = 154.1s > 2m
		{"checkpoint timeout 30s", []runtime.ClusterOpt{runtime.CheckpointTimeout(30 * time.Second)}, true},
		// 6 x (1s + 20s) + 100ms + 20s = 146.1s > 2m
		{"checkpoint timeout 20s, 5 tolerated failures", []runtime.ClusterOpt{runtime.CheckpointTimeout(20 * time.Second), runtime.TolerableCheckpointFailures(5)}, true},
		// 4 x (1s + 20s) + 100ms + 20s = 104.1s < 2m
		{"checkpoint timeout 20s", []runtime.ClusterOpt{runtime.CheckpointTimeout(20 * time.Second)}, false},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			topic := fmt.Sprintf("timing-%d", i)
			env.CreateTopic(t, topic, 1, nil)
			const n = 50
			job := numberedJob(t, topic, numberedItems(n), 0, 1, shapeDirect,
				newNumberedSink(t, env.Addr, topic, TransactionTimeout(2*time.Minute)))
			opts := append([]runtime.ClusterOpt{runtime.CheckpointInterval(time.Second)}, tc.copts...)
			res, err := runtime.NewMiniCluster(opts...).Run(t.Context(), job)
			recs := env.ReadCommitted(t, topic)
			if !tc.refuse {
				if err != nil {
					t.Fatalf("Run = %v, want the job to run", err)
				}
				checkExactlyOnce(t, recs, n)
				return
			}
			if !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, runtime.ErrUnrecoverable) || !strings.Contains(err.Error(), "must exceed") {
				t.Fatalf("Run = %v (%d records committed); want an unrecoverable ErrInvalidConfig about the transaction timeout", err, len(recs))
			}
			if res.Restarts != 0 || len(recs) != 0 {
				t.Fatalf("%d restarts, %d records committed: want none", res.Restarts, len(recs))
			}
		})
	}
}

// dropStateRecord deletes the state record of checkpoint id of job from the
// store in dir (layout in checkpoint/store.go: "cp/<job>\x00<id>m"), which
// makes the checkpoint unusable while its handles record stays readable:
// the restore falls back to the checkpoint before and must commit this
// one's transactions.
func dropStateRecord(t *testing.T, dir, job string, id checkpoint.ID) {
	t.Helper()
	db, err := pebble.Open(dir, &pebble.Options{})
	if err != nil {
		t.Fatal(err)
	}
	key := binary.BigEndian.AppendUint64(append([]byte("cp/"+job), 0), uint64(id))
	if err := errors.Join(db.Delete(append(key, 'm'), pebble.Sync), db.Close()); err != nil {
		t.Fatal(err)
	}
}

// TestSinkFallsBackPastACorruptCheckpointTwice: the newest checkpoint's
// state is unreadable, so the job restores the one before and must commit
// the newest one's transactions (of both sink subtasks) before any subtask
// fences its ids, and keep those ids reserved, so that a second failure
// before any new checkpoint completes restores the same way again. The job
// must finish, with every record committed (the fallback window may repeat
// records, never lose them) and no transaction left open.
func TestSinkFallsBackPastACorruptCheckpointTwice(t *testing.T) {
	env := kafkatest.New(t)
	const topic, job, n = "fallback", "fallback", 1600
	env.CreateTopic(t, topic, 4, nil)
	dir := t.TempDir()
	items := numberedItems(n)
	newJob := func() *runtime.Job {
		j := runtime.NewJob(job, runtime.DefaultParallelism(2))
		slice := runtime.SliceSource(items, 4)
		s := runtime.FromSource(j, "numbers", func() runtime.Source[numbered] {
			return pacedSource[numbered]{Source: slice(), pause: time.Millisecond}
		})
		// A shuffle, so each sink subtask gets records of both sources.
		s = runtime.Rebalance(s)
		runtime.SinkTo(s, "kafka", newNumberedSink(t, env.Addr, topic, TransactionalIDPrefix("fallback")))
		return j
	}

	// Run 1: the coordinator dies right after persisting its 4th checkpoint.
	store, err := checkpoint.OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	var persisted int
	fp := &hookFailpoints{fn: func(name string) error {
		if name == failpoint.JMAfterCheckpointPersisted {
			if persisted++; persisted == 4 {
				return errCrash
			}
		}
		return nil
	}}
	if _, err := runtime.NewMiniCluster(runtime.CheckpointStore(store), runtime.CheckpointInterval(10*time.Millisecond),
		runtime.Failpoints(fp), runtime.Restarts(0, 0)).Run(t.Context(), newJob()); !errors.Is(err, errCrash) {
		t.Fatalf("first run: %v, want the injected crash", err)
	}
	newest, err := store.Latest(t.Context(), job)
	if err != nil {
		t.Fatal(err)
	}
	subtasks := map[string]bool{}
	for _, h := range newest.Handles() {
		subtasks[h.TransactionalID[:len("fallback-0")]] = true
	}
	if len(subtasks) != 2 {
		t.Fatalf("the newest checkpoint's transactions %v are not of both sink subtasks: nothing to test", newest.Handles())
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	dropStateRecord(t, dir, job, newest.ID)

	// Run 2: falls back; its first attempt fails before any checkpoint
	// completes (checkpoints every 2 minutes), so the second attempt falls back to
	// the same checkpoint again.
	store, err = checkpoint.OpenStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var processed atomic.Int64
	fp = &hookFailpoints{fn: func(name string) error {
		if name == failpoint.TaskProcess && processed.Add(1) == 50 {
			return errCrash
		}
		return nil
	}}
	res, err := runtime.NewMiniCluster(runtime.CheckpointStore(store), runtime.CheckpointInterval(2*time.Minute),
		runtime.Failpoints(fp), runtime.Restarts(3, 10*time.Millisecond)).Run(t.Context(), newJob())
	if err != nil {
		t.Fatalf("second run: %v", err)
	}
	if res.Restarts != 1 {
		t.Fatalf("second run restarted %d times, want 1 (the injected failure)", res.Restarts)
	}
	recs := env.ReadCommitted(t, topic)
	seen := map[string]bool{}
	for _, r := range recs {
		seen[string(r.Key)+"/"+string(r.Value)] = true
	}
	for _, it := range items {
		if k := fmt.Sprintf("%s/%d", it.Key, it.Seq); !seen[k] {
			t.Fatalf("record %s lost (%d records committed)", k, len(recs))
		}
	}
	requireNoOpenTxn(t, t.Context(), env.Admin(t), topic)
}

type hookFailpoints struct{ fn func(string) error }

func (h *hookFailpoints) Inject(name string) error { return h.fn(name) }
