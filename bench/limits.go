package bench

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/sources/sharegroup"
)

// Limits measures what this machine and the in-process broker can do at
// most, so every report shows the distance to it. Two lines, each the
// median of 3 runs (2 with Quick), the two limits alternating:
//   - limit-produce: raw produce, records/s of eos-sink's 50-byte records
//     with one idempotent franz-go client (eos-sink's baseline alone), the
//     clock stopping at the last acknowledgement;
//   - limit-share-consume: raw share consume + ACCEPT, records/s of
//     eos-wordcount's input lines (8 partitions) read by 2 share consumers
//     that do nothing but poll and accept (the ceiling of eos-wordcount's
//     lines/s), the clock stopping when both flushed their last ACCEPT.
//
// Every run is checked after its timed window: every produced record
// acknowledged; every input record delivered exactly once.
func Limits(ctx context.Context, cfg Config) ([]Line, error) {
	n, lines, runs := cfg.sizeOf(3_000_000, 1_000_000, 50_000), cfg.sizeOf(200_000, 60_000, 3_000), cfg.runsOf(3, 2)
	kb, err := startBroker(ctx)
	if err != nil {
		return nil, err
	}
	defer kb.Close()
	cfg.progress("producing %d lines", lines)
	if err := produceCorpus(ctx, kb.addr, "limit-lines", Corpus(3, lines, 6, 5_000)); err != nil {
		return nil, err
	}
	value := sinkValues()
	prod, cons, err := alternate(runs, func(side string, i int) { cfg.progress("run %d/%d: %s", i+1, runs, side) },
		func(i int) (float64, error) {
			el, err := plainProduce(ctx, kb.adm, kb.addr, fmt.Sprintf("limit-produce-%d", i), n, value)
			return float64(n) / el.Seconds(), err
		},
		func(i int) (float64, error) {
			el, err := shareConsume(ctx, kb, "limit-lines", fmt.Sprintf("limit-consume-%d", i), lines)
			return float64(lines) / el.Seconds(), err
		})
	if err != nil {
		return nil, err
	}
	return []Line{
		spread(Line{Bench: "limit-produce", Metric: "records_per_s",
			Note: fmt.Sprintf("plain franz-go produce, one client, %d records of %d B; median of %d runs", n, eosSinkValueSize, runs)}, prod),
		spread(Line{Bench: "limit-share-consume", Metric: "records_per_s",
			Note: fmt.Sprintf("2 share consumers, poll + ACCEPT only, %d lines on 8 partitions; median of %d runs", lines, runs)}, cons),
	}, nil
}

// partOffset is a record's place in its topic.
type partOffset struct {
	p int32
	o int64
}

// limitFetchWait bounds a share fetch's long poll. The last ACCEPT waits
// for the fetch in flight; with kgo's default (500 ms) that wait, not the
// consuming, would dominate the measurement.
const limitFetchWait = 10 * time.Millisecond

// shareConsume reads n records of topic with 2 consumers of a new share
// group, accepting them, and returns the time until both flushed their last
// ACCEPT. It then checks that every record came exactly once.
func shareConsume(ctx context.Context, kb *kafkaBroker, topic, group string, n int) (time.Duration, error) {
	if err := sharegroup.SetGroupConfig(ctx, kb.cl, group, "share.auto.offset.reset", "earliest"); err != nil {
		return 0, err
	}
	var got atomic.Int64
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	const consumers = 2
	seen := make([][]partOffset, consumers)
	done := make([]time.Duration, consumers)
	errs := make([]error, consumers)
	var wg sync.WaitGroup
	for c := range consumers {
		cl, err := kgo.NewClient(kgo.SeedBrokers(kb.addr), kgo.ShareGroup(group), kgo.ConsumeTopics(topic), kgo.ShareMaxRecords(2000),
			kgo.FetchMaxWait(limitFetchWait))
		if err != nil {
			return 0, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cl.Close()
			for lctx.Err() == nil {
				// Polling again accepts the previous poll's records.
				fs := cl.PollRecords(lctx, 2000)
				k := 0
				fs.EachRecord(func(r *kgo.Record) {
					seen[c] = append(seen[c], partOffset{r.Partition, r.Offset})
					k++
				})
				if k > 0 && got.Add(int64(k)) >= int64(n) {
					cancel()
				}
			}
			cl.MarkAcks(kgo.AckAccept)
			errs[c] = cl.FlushAcks(ctx)
			done[c] = time.Since(start)
		}()
	}
	wg.Wait()
	for c, err := range errs {
		if err != nil {
			return 0, fmt.Errorf("consumer %d: accept: %w", c, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	all := slices.Concat(seen...)
	slices.SortFunc(all, func(a, b partOffset) int { return cmp.Or(cmp.Compare(a.p, b.p), cmp.Compare(a.o, b.o)) })
	if distinct := len(slices.Compact(slices.Clone(all))); distinct != len(all) || len(all) != n {
		return 0, fmt.Errorf("share group %s: %d deliveries of %d distinct records, want each of %d once", group, len(all), distinct, n)
	}
	return slices.Max(done), nil
}
