package bench

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sinks/kafka"
)

// eosSinkValueSize is the size of every record value; eosSinkValues is how
// many distinct values the records cycle through (values are read-only, so
// both sides share them).
const (
	eosSinkValueSize = 50
	eosSinkValues    = 1 << 16
)

// EOSSink measures the exactly-once Kafka sink in the mini cluster
// (SliceSource -> sink, parallelism 1, a checkpoint every 100 ms, one
// transaction per checkpoint) against plain franz-go produce (idempotent,
// one client, flushed at the end) of the same 50-byte records to the same
// in-process broker, in records per second, alternating the two sides (3
// runs each, 2 with Quick). Each run writes to a topic of its own with the
// broker's default partition count, deleted after the run. Weir's clock
// runs until the job has finished (its last transaction committed); the
// baseline's until its last acknowledgement. The record counts (3M, quick
// 1M) make the job span several checkpoints: the sink runs at millions of
// records per second in-process, so 300k records would fit in a single
// 100 ms interval. After its timed window, each exactly-once run must leave
// exactly every record visible to read_committed, or the benchmark fails.
func EOSSink(ctx context.Context, cfg Config) ([]Line, error) {
	n, runs := cfg.sizeOf(3_000_000, 1_000_000, 50_000), cfg.runsOf(3, 2)
	kb, err := startBroker(ctx)
	if err != nil {
		return nil, err
	}
	defer kb.Close()

	value := sinkValues()
	items := make([]int, n)
	for i := range items {
		items[i] = i
	}
	var checkpoints []int64
	weir, base, err := alternate(runs, func(side string, i int) { cfg.progress("run %d/%d: %s", i+1, runs, side) },
		func(i int) (float64, error) {
			el, cps, err := eosSinkRun(ctx, kb.adm, kb.addr, fmt.Sprintf("eos-sink-weir-%d", i), items, value)
			checkpoints = append(checkpoints, cps)
			return float64(n) / el.Seconds(), err
		},
		func(i int) (float64, error) {
			el, err := plainProduce(ctx, kb.adm, kb.addr, fmt.Sprintf("eos-sink-plain-%d", i), n, value)
			return float64(n) / el.Seconds(), err
		})
	if err != nil {
		return nil, err
	}
	l := compared("eos-sink", "records_per_s", "franz-go-produce", weir, base)
	l.Note = fmt.Sprintf("%d records of %d B, parallelism 1, 100 ms checkpoints (%v per run); %s",
		n, eosSinkValueSize, checkpoints, l.Note)
	return []Line{l}, nil
}

// sinkValues returns the value of record i: eosSinkValueSize bytes, cycling
// through eosSinkValues distinct read-only values (shared by every run).
func sinkValues() func(i int) []byte {
	values := make([]byte, eosSinkValues*eosSinkValueSize)
	for i := range values {
		values[i] = 'a' + byte(i%26)
	}
	return func(i int) []byte {
		i %= eosSinkValues
		return values[i*eosSinkValueSize : (i+1)*eosSinkValueSize : (i+1)*eosSinkValueSize]
	}
}

// kafkaBroker is a benchmark's in-process broker and a client on it for
// administration.
type kafkaBroker struct {
	b    *broker.Broker
	addr string
	cl   *kgo.Client
	adm  *kadm.Client
}

func startBroker(ctx context.Context) (*kafkaBroker, error) {
	b, err := broker.Start(ctx, broker.Listen("127.0.0.1:0"))
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()))
	if err != nil {
		return nil, errors.Join(err, b.Close())
	}
	return &kafkaBroker{b: b, addr: b.Addr(), cl: cl, adm: kadm.NewClient(cl)}, nil
}

// Close closes the client, then the broker.
func (k *kafkaBroker) Close() {
	k.cl.Close()
	_ = k.b.Close()
}

func createTopic(ctx context.Context, adm *kadm.Client, topic string) error {
	resp, err := adm.CreateTopic(ctx, -1, 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	return nil
}

// deleteTopic deletes a measured run's topic, so the in-memory broker does
// not keep every run's records. A failure only costs memory: it is ignored.
func deleteTopic(ctx context.Context, adm *kadm.Client, topic string) {
	_, _ = adm.DeleteTopics(ctx, topic)
}

// plainProduce produces n records with one idempotent franz-go client and
// waits for every acknowledgement.
func plainProduce(ctx context.Context, adm *kadm.Client, addr, topic string, n int, value func(int) []byte) (time.Duration, error) {
	if err := createTopic(ctx, adm, topic); err != nil {
		return 0, err
	}
	defer deleteTopic(ctx, adm, topic)
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	if err := cl.Ping(ctx); err != nil {
		return 0, err
	}
	var failed atomic.Pointer[error]
	promise := func(_ *kgo.Record, err error) {
		if err != nil {
			failed.CompareAndSwap(nil, &err)
		}
	}
	start := time.Now()
	for i := range n {
		cl.Produce(ctx, &kgo.Record{Value: value(i)}, promise)
	}
	if err := cl.Flush(ctx); err != nil {
		return 0, err
	}
	el := time.Since(start)
	if p := failed.Load(); p != nil {
		return 0, *p
	}
	return el, nil
}

// eosSinkRun runs SliceSource(items) -> exactly-once Kafka sink to topic in
// the mini cluster and checks that read_committed sees every record.
func eosSinkRun(ctx context.Context, adm *kadm.Client, addr, topic string, items []int, value func(int) []byte) (time.Duration, int64, error) {
	if err := createTopic(ctx, adm, topic); err != nil {
		return 0, 0, err
	}
	defer deleteTopic(ctx, adm, topic)
	sink, err := kafka.NewSink(func(i int) (*kgo.Record, error) {
		return &kgo.Record{Topic: topic, Value: value(i)}, nil
	}, []kafka.Opt{kafka.Brokers(addr)})
	if err != nil {
		return 0, 0, err
	}
	j := runtime.NewJob(topic)
	runtime.SinkTo(runtime.FromSource(j, "records", runtime.SliceSource(items, 256)), "kafka", sink)
	var checkpoints atomic.Int64
	mc := runtime.NewMiniCluster(runtime.CheckpointInterval(100*time.Millisecond), runtime.MinPause(0), runtime.Restarts(0, 0),
		runtime.OnCheckpointComplete(func(runtime.CheckpointEvent) { checkpoints.Add(1) }))
	start := time.Now()
	if _, err := mc.Run(ctx, j); err != nil {
		return 0, 0, err
	}
	el := time.Since(start)
	got, err := countCommitted(ctx, adm, addr, topic)
	if err != nil {
		return 0, 0, err
	}
	if got != int64(len(items)) {
		return 0, 0, fmt.Errorf("exactly-once sink: read_committed sees %d records of %d", got, len(items))
	}
	return el, checkpoints.Load(), nil
}

// countCommitted counts the data records of topic a read_committed reader
// sees up to the last stable offsets.
func countCommitted(ctx context.Context, adm *kadm.Client, addr, topic string) (int64, error) {
	ends, err := adm.ListCommittedOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	end := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			end[o.Partition] = o.Offset
		}
	})
	if len(end) == 0 {
		return 0, nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var count int64
	for len(end) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return 0, fmt.Errorf("count %s: %w", topic, err)
		}
		var ferr error
		fs.EachError(func(_ string, p int32, err error) { ferr = errors.Join(ferr, fmt.Errorf("partition %d: %w", p, err)) })
		if ferr != nil {
			return 0, ferr
		}
		fs.EachRecord(func(r *kgo.Record) {
			e, ok := end[r.Partition]
			if !ok || r.Offset >= e {
				return
			}
			if !r.Attrs.IsControl() {
				count++
			}
			if r.Offset+1 == e {
				delete(end, r.Partition)
			}
		})
	}
	return count, nil
}
