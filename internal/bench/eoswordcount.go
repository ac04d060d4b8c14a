package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/kafkatxn/committed"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sources/sharegroup"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// EOSWordcount measures the exactly-once wordcount (share group ->
// transactional sink, mini cluster, 100 ms checkpoints plus readiness
// triggers) against a hand-written franz-go at-least-once share-consume,
// count, produce loop (2 consumers, flush per poll), on the same in-process
// broker and the same input, in input lines per second. It also reports the
// largest number of records a source subtask held per partition against the
// broker's cap (share-inflight).
func EOSWordcount(ctx context.Context, cfg Config) ([]Line, error) {
	lines := 200_000
	if cfg.Quick {
		lines = 60_000
	}
	b, err := broker.Start(ctx, broker.Listen("127.0.0.1:0"))
	if err != nil {
		return nil, err
	}
	defer b.Close()
	corpus := Corpus(3, lines, 6, 5_000)
	words := 0
	for _, l := range corpus {
		words += len(wordcount.Words(l))
	}
	cfg.progress("producing %d lines", lines)
	if err := produceCorpus(ctx, b.Addr(), "bench-lines", corpus); err != nil {
		return nil, err
	}
	cfg.progress("baseline: franz-go share loop")
	base, err := shareLoop(ctx, b.Addr(), "bench-lines", "bench-loop-out", words)
	if err != nil {
		return nil, fmt.Errorf("baseline: %w", err)
	}
	var mu sync.Mutex
	maxHeld, limit := 0, 0
	cfg.progress("weir: exactly-once wordcount")
	weir, err := weirEOSWordcount(ctx, b.Addr(), words, sharegroup.ObserveInFlight(func(held map[acklog.TopicPartition]int, lim int) {
		mu.Lock()
		defer mu.Unlock()
		limit = lim
		for _, n := range held {
			maxHeld = max(maxHeld, n)
		}
	}))
	if err != nil {
		return nil, err
	}
	wv, bv := float64(lines)/weir.Seconds(), float64(lines)/base.Seconds()
	mu.Lock()
	defer mu.Unlock()
	return []Line{
		{Bench: "eos-wordcount", Metric: "records_per_s", Value: wv, Baseline: "franz-go-share-loop", BaselineValue: bv, Ratio: wv / bv,
			Note: fmt.Sprintf("input lines/s; %d lines, %d words, 8 partitions", lines, words)},
		{Bench: "share-inflight", Metric: "max_held_per_partition", Value: float64(maxHeld),
			Baseline: "group.share.partition.max.record.locks", BaselineValue: float64(limit), Ratio: float64(maxHeld) / float64(max(limit, 1))},
	}, nil
}

func produceCorpus(ctx context.Context, addr, topic string, corpus []string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic), kgo.ProducerBatchMaxBytes(16<<10))
	if err != nil {
		return err
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 8, -1, nil, topic); err != nil {
		return err
	}
	recs := make([]*kgo.Record, len(corpus))
	for i, l := range corpus {
		recs[i] = kgo.StringRecord(l)
	}
	return cl.ProduceSync(ctx, recs...).FirstErr()
}

func weirEOSWordcount(ctx context.Context, addr string, words int, opts ...sharegroup.Opt) (time.Duration, error) {
	job, err := wordcount.BuildWith(runtime.Params{"brokers": addr, "input": "bench-lines", "output": "bench-weir-out",
		"group": "bench-weir", "guarantee": "exactly-once"}, opts...)
	if err != nil {
		return 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := runtime.NewMiniCluster(runtime.CheckpointInterval(100*time.Millisecond)).Run(rctx, job)
		done <- err
	}()
	for {
		if ok, err := committed.Reached(ctx, []string{addr}, "bench-weir-out", words); err == nil && ok {
			el := time.Since(start)
			cancel()
			<-done
			return el, nil
		}
		select {
		case err := <-done:
			return 0, fmt.Errorf("wordcount stopped: %w", err)
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// shareLoop is the hand-written baseline: 2 share consumers, each polling,
// counting words in a shared map, producing every running count, flushing the
// producer, then acknowledging the poll (at-least-once). It returns when
// every word's count was produced.
func shareLoop(ctx context.Context, addr, in, out string, words int) (time.Duration, error) {
	admin, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return 0, err
	}
	defer admin.Close()
	if err := sharegroup.SetGroupConfig(ctx, admin, "bench-loop", "share.auto.offset.reset", "earliest"); err != nil {
		return 0, err
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(out), kgo.AllowAutoTopicCreation())
	if err != nil {
		return 0, err
	}
	defer prod.Close()
	var mu sync.Mutex
	counts := map[string]int64{}
	var produced atomic.Int64
	start := time.Now()
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for i := 0; i < 2; i++ {
		cons, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ShareGroup("bench-loop"), kgo.ConsumeTopics(in), kgo.ShareMaxRecords(2000))
		if err != nil {
			return 0, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cons.Close()
			for lctx.Err() == nil {
				fs := cons.PollRecords(lctx, 2000)
				var batch []*kgo.Record
				fs.EachRecord(func(r *kgo.Record) {
					mu.Lock()
					for _, w := range strings.Fields(strings.ToLower(string(r.Value))) {
						counts[w]++
						batch = append(batch, &kgo.Record{Key: []byte(w), Value: fmt.Appendf(nil, "%d", counts[w])})
					}
					mu.Unlock()
				})
				if len(batch) == 0 {
					continue
				}
				if err := prod.ProduceSync(lctx, batch...).FirstErr(); err != nil {
					if !errors.Is(err, context.Canceled) {
						errs <- err
					}
					return
				}
				cons.MarkAcks(kgo.AckAccept)
				if err := cons.FlushAcks(lctx); err != nil && lctx.Err() == nil {
					errs <- err
					return
				}
				if produced.Add(int64(len(batch))) >= int64(words) {
					cancel()
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	select {
	case err := <-errs:
		return 0, err
	default:
	}
	if produced.Load() < int64(words) {
		return 0, fmt.Errorf("produced %d of %d counts: %w", produced.Load(), words, ctx.Err())
	}
	return el, nil
}
