package kafka

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
)

// lateCheck is a keyed processor that emits "late <value>" for a record at
// or behind its input watermark, "ok" otherwise.
type lateCheck struct{}

func (lateCheck) Open(context.Context, *runtime.StateRegistry[int]) error { return nil }
func (lateCheck) ProcessElement(ctx *runtime.KeyedContext[int], v string, out runtime.Collector[string]) error {
	if ctx.Timestamp() <= ctx.CurrentWatermark() {
		out.Collect("late " + v)
		return nil
	}
	out.Collect("ok")
	return nil
}
func (lateCheck) OnTimer(*runtime.KeyedContext[int], int64, runtime.Collector[string]) error {
	return nil
}

// requireNoneLate runs src at parallelism par with watermark strategy ws,
// keyed to one key, and fails unless all its n records arrive on time
// (ahead of their operator's watermark).
func requireNoneLate(t *testing.T, src func() runtime.Source[string], par int, ws runtime.WatermarkStrategy[string], n int) {
	t.Helper()
	j := runtime.NewJob("wm", runtime.DefaultParallelism(par))
	s := runtime.FromSource(j, "source", src, runtime.Watermarks(ws))
	ks := runtime.KeyBy(s, func(string) int { return 0 }, nil)
	checked := runtime.ProcessKeyed(ks, "check", func() runtime.KeyedProcessor[int, string, string] { return lateCheck{} })
	var mu sync.Mutex
	var late []string
	ok := 0
	runtime.SinkTo(checked, "collect", runtime.SinkFunc(func(_ context.Context, v string) error {
		mu.Lock()
		defer mu.Unlock()
		if strings.HasPrefix(v, "late ") {
			late = append(late, v)
		} else {
			ok++
		}
		return nil
	}))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if _, err := runtime.NewMiniCluster(runtime.CheckpointInterval(time.Second)).Run(ctx, j); err != nil {
		t.Fatal(err)
	}
	if len(late) > 0 || ok != n {
		t.Fatalf("%d records on time, %d late (e.g. %v); want all %d on time", ok, len(late), head(late), n)
	}
}

// Two partitions at very different event-time speeds, read by one subtask
// in many small polls with a watermark after each: the runtime keeps a
// watermark per partition (runtime.SplitCollector) and the subtask's is
// their minimum, so no record of the slow partition is late, although the
// fast one runs far ahead in event time (a watermark over the subtask's
// records would pass the slow partition's records at once).
func TestPerPartitionWatermarksMakeNoRecordOfASlowPartitionLate(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "clicks", 2, nil)
	const n = 4000
	// Partition 0 advances 1 s per record, partition 1 10 ms.
	produce(t, env, "clicks", 2, 0, n, "c", func(i int) int64 {
		if i%2 == 0 {
			return 1_000_000 + int64(i/2)*1000
		}
		return 1_000_000 + int64(i/2)*10
	})
	src, err := New(decodeString, Brokers(env.Addr), Topics("clicks"), StopAt(Latest()), MaxPollRecords(50))
	if err != nil {
		t.Fatal(err)
	}
	requireNoneLate(t, src, 1, runtime.ForMonotonousTimestamps[string](
		runtime.WithWatermarkInterval(time.Millisecond)), n)
}

// timerAtRecord registers an event-time timer at each record's timestamp
// and emits "fired" when one fires: it fires only once the watermark
// passes the record.
type timerAtRecord struct{}

func (timerAtRecord) Open(context.Context, *runtime.StateRegistry[int]) error { return nil }
func (timerAtRecord) ProcessElement(ctx *runtime.KeyedContext[int], _ string, _ runtime.Collector[string]) error {
	ctx.TimerService().RegisterEventTimeTimer(ctx.Timestamp())
	return nil
}
func (timerAtRecord) OnTimer(_ *runtime.KeyedContext[int], _ int64, out runtime.Collector[string]) error {
	out.Collect("fired")
	return nil
}

// Idleness per partition: a partition of the subtask that never gets a
// record holds the watermark back (nothing fires) without idleness; with
// WithIdleness it is idle after the timeout, and the watermark follows
// the partition that has records.
func TestAnEmptyPartitionHoldsTheWatermarkOnlyUntilItIsIdle(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 2, nil)
	// Records in partition 0 only (even i), one second apart.
	produce(t, env, "in", 2, 0, 1, "r", func(int) int64 { return 1_000_000 })
	for i := 1; i < 20; i++ {
		produce(t, env, "in", 1, 0, 1, "r", func(int) int64 { return 1_000_000 + int64(i)*1000 })
	}
	// run runs the job for at most d, or until want timers fired.
	run := func(idle, d time.Duration, want int) int {
		t.Helper()
		src, err := New(decodeString, Brokers(env.Addr), Topics("in"))
		if err != nil {
			t.Fatal(err)
		}
		j := runtime.NewJob("idle")
		s := runtime.FromSource(j, "source", src, runtime.Watermarks(runtime.ForMonotonousTimestamps[string](
			runtime.WithIdleness(idle), runtime.WithWatermarkInterval(10*time.Millisecond))))
		fired := runtime.ProcessKeyed(runtime.KeyBy(s, func(string) int { return 0 }, nil), "timers",
			func() runtime.KeyedProcessor[int, string, string] { return timerAtRecord{} })
		ctx, cancel := context.WithTimeout(t.Context(), d)
		defer cancel()
		var mu sync.Mutex
		n := 0
		runtime.SinkTo(fired, "count", runtime.SinkFunc(func(context.Context, string) error {
			mu.Lock()
			defer mu.Unlock()
			if n++; n == want {
				cancel()
			}
			return nil
		}))
		if _, err := runtime.NewMiniCluster(runtime.CheckpointInterval(time.Second)).Run(ctx, j); !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			t.Fatalf("run: %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		return n
	}
	if n := run(0, 3*time.Second, 1); n != 0 {
		t.Fatalf("without idleness %d timers fired in 3 s; the empty partition must hold the watermark", n)
	}
	// All but the last record's timer: the watermark is the largest timestamp minus 1 ms.
	if n := run(300*time.Millisecond, time.Minute, 19); n != 19 {
		t.Fatalf("with idleness %d timers fired, want 19", n)
	}
}

// splitLog is a SplitCollector that records the split sets a source
// declares.
type splitLog struct {
	sliceCollector
	sets [][]string
}

func (c *splitLog) CollectWithTimestamp(v string, _ int64)       { c.Collect(v) }
func (c *splitLog) CollectFromSplit(_ string, v string, _ int64) { c.Collect(v) }
func (c *splitLog) SetSplits(splits []string)                    { c.sets = append(c.sets, slices.Clone(splits)) }
func (c *splitLog) SplitPending(string)                          {}

// A bounded source whose partitions all reach their stop offsets ends
// (ErrEndOfInput, then the final watermark) without first declaring that
// it reads no split: the runtime would mark the subtask idle, and the
// operators downstream would then advance their watermark past results
// that windows fed by this subtask had yet to fire (Nexmark q7 lost top
// bids this way on the partitions source with stop=latest, 1 run in 10).
func TestABoundedSourceEndsWithoutFirstDeclaringItReadsNoSplit(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 3, nil)
	const n = 300
	produce(t, env, "in", 3, 0, n, "r", nil)
	s, err := openSource(t, env, nil, Topics("in"), StopAt(Latest()))
	if err != nil {
		t.Fatal(err)
	}
	c := &splitLog{}
	for deadline := time.Now().Add(time.Minute); ; {
		err := s.Poll(t.Context(), c)
		if errors.Is(err, runtime.ErrEndOfInput) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no end of input in a minute (%d records read)", len(c.vals))
		}
	}
	if len(c.vals) != n {
		t.Fatalf("read %d records, want %d", len(c.vals), n)
	}
	if len(c.sets) == 0 {
		t.Fatal("the source never declared its splits")
	}
	for i, set := range c.sets {
		if len(set) == 0 {
			t.Fatalf("split declaration %d of %d is empty (%v): the subtask would turn idle before its end", i+1, len(c.sets), c.sets)
		}
	}
}

// A partition whose records wait in the client behind another partition's
// backlog is not idle: a subtask reads two partitions whose records are all
// fetched at once, but its polls take one partition's records at a time and
// each poll is slow (a slow decode), longer than the idleness timeout. The
// waiting partition must keep holding the watermark; taken for idle, it
// would let the subtask's watermark jump to the other partition's, far ahead
// in event time, and its own records would then all be late (the sessions
// job lost about a fifth of its sessions this way under load).
func TestAPartitionWaitingBehindAnothersBacklogIsNotIdle(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "clicks", 2, nil)
	const n = 1200
	// Partition 0 advances 1 s per record, partition 1 10 ms.
	produce(t, env, "clicks", 2, 0, n, "c", func(i int) int64 {
		if i%2 == 0 {
			return 1_000_000 + int64(i/2)*1000
		}
		return 1_000_000 + int64(i/2)*10
	})
	slow := func(r *kgo.Record) (string, error) {
		time.Sleep(time.Millisecond)
		return string(r.Value), nil
	}
	src, err := New(slow, Brokers(env.Addr), Topics("clicks"), StopAt(Latest()), MaxPollRecords(200))
	if err != nil {
		t.Fatal(err)
	}
	requireNoneLate(t, src, 1, runtime.ForMonotonousTimestamps[string](
		runtime.WithIdleness(50*time.Millisecond), runtime.WithWatermarkInterval(time.Millisecond)), n)
}

// slowFirstFetch holds the first fetch response any client of the job
// reads for d: one subtask starts late.
type slowFirstFetch struct {
	d    time.Duration
	done atomic.Bool
}

func (s *slowFirstFetch) OnBrokerRead(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, _ error) {
	if key == 1 && s.done.CompareAndSwap(false, true) { // 1: Fetch
		time.Sleep(s.d)
	}
}

// A partition with records readable at the broker is not idle before its
// first fetch arrives: of two subtasks, one reads its partition at once and
// the other's first fetch takes twenty times the idleness timeout. Taken for
// idle, the late subtask would let the operator downstream follow the other
// to the end of its partition, and every record of the late one would be
// late.
func TestAPartitionWithRecordsNotYetFetchedIsNotIdle(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "clicks", 2, nil)
	const n = 600
	produce(t, env, "clicks", 2, 0, n, "c", func(i int) int64 { return 1_000_000 + int64(i/2)*1000 })
	src, err := New(decodeString, Brokers(env.Addr), Topics("clicks"), StopAt(Latest()),
		ClientOpts(kgo.WithHooks(&slowFirstFetch{d: 2 * time.Second})))
	if err != nil {
		t.Fatal(err)
	}
	requireNoneLate(t, src, 2, runtime.ForMonotonousTimestamps[string](
		runtime.WithIdleness(100*time.Millisecond), runtime.WithWatermarkInterval(time.Millisecond)), n)
}

// pendingLog is a splitLog that counts the splits said to have records
// pending since the last reset.
type pendingLog struct {
	splitLog
	pending map[string]int
}

func (c *pendingLog) SplitPending(split string) { c.pending[split]++ }

// Records fetched into the client and not yet polled keep their partition
// active even when the last stable offset the source knows of it is stale
// (records written since its last fetch, the usual case on a live topic):
// a Poll that takes one partition's records says the other, whose records
// wait behind them, has records pending.
func TestRecordsWaitingInTheClientKeepTheirPartitionActive(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 2, nil)
	s, err := openSource(t, env, nil, Topics("in"), MaxPollRecords(100), ClientOpts(kgo.FetchMaxWait(100*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	c := &pendingLog{pending: map[string]int{}}
	deadline := time.Now().Add(time.Minute)
	for len(c.sets) == 0 { // discovered: both partitions known, empty
		if err := s.Poll(t.Context(), c); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("no splits declared in a minute")
		}
	}
	// Both partitions' records in one fetch: the client fetches nothing
	// while they are written (a fetch waiting at the broker would be
	// answered with the first partition written, and the client fetches
	// again only after a poll), then one fetch finds both.
	s.cl.PauseFetchTopics("in")
	time.Sleep(500 * time.Millisecond) // a fetch in flight ends (FetchMaxWait), empty
	cl := env.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(100*time.Millisecond))
	const n = 500
	var recs []*kgo.Record
	for i := range 2 * n {
		recs = append(recs, &kgo.Record{Topic: "in", Partition: int32(i % 2), Value: []byte("r" + strconv.Itoa(i))})
	}
	if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	s.cl.ResumeFetchTopics("in")
	for s.cl.BufferedFetchRecords() < 2*n {
		if time.Now().After(deadline) {
			t.Fatalf("%d records buffered in the client, want %d", s.cl.BufferedFetchRecords(), 2*n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	clear(c.pending)
	if err := s.Poll(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	if len(c.vals) != 100 {
		t.Fatalf("the poll took %d records, want 100 (MaxPollRecords)", len(c.vals))
	}
	taken := map[string]bool{}
	for k, ps := range s.parts {
		if ps.next.Load() > 0 {
			taken[k.String()] = true
		}
	}
	for k, ps := range s.parts {
		if name := k.String(); !taken[name] {
			if ps.stable != 0 {
				t.Fatalf("%s: last stable offset known %d, want 0 (nothing of it polled yet)", name, ps.stable)
			}
			if c.pending[name] == 0 {
				t.Fatalf("%s has %d records waiting in the client, but the poll did not say it has records pending (pending: %v)", name, n, c.pending)
			}
		}
	}
}
