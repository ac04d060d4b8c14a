package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/input"
	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/kafkatxn/committed"
	"github.com/weirstream/weir/sources/sharegroup"
)

// EOSWordcountKafka measures the exactly-once wordcount on the partition
// source (sources/kafka: offsets in checkpoint state, source=kafka) against
// the same job on the share-group source (eos-wordcount's Weir side:
// CommitWhenIdle), and against a hand-written ceiling of an exactly-once
// wordcount on partitions (partitionTxnLoop: one read_committed partition
// consumer, a running count per word, one transaction per poll). The three
// run in turn on the same in-process broker and the same input (3 runs
// each, 2 with Quick; each run a group and output of its own), in input
// lines per second, with eos-wordcount's clocks: Weir's stops when its last
// output record became visible to read_committed readers, the loop's when
// its last commit returned. Every output is read back and checked record by
// record outside the timed windows.
func EOSWordcountKafka(ctx context.Context, cfg Config) ([]Line, error) {
	b, err := startEOSBench(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer b.kb.Close()
	vs, err := b.alternate(cfg,
		b.side("weir-kafka", func(i int) (time.Duration, error) {
			return weirEOSWordcount(ctx, b.kb, i, b.want, b.words, input.Partitions)
		}),
		b.side("weir-sharegroup", func(i int) (time.Duration, error) {
			return weirEOSWordcount(ctx, b.kb, i, b.want, b.words, input.ShareGroup, sharegroup.CommitWhenIdle(eosIdleCommit))
		}),
		b.side("ceiling", func(i int) (time.Duration, error) { return partitionTxnLoop(ctx, b.kb, i, b.want) }))
	if err != nil {
		return nil, err
	}
	kafka, share, ceiling := vs[0], vs[1], vs[2]
	l := compared("eos-wordcount-kafka", "records_per_s", "eos-wordcount-sharegroup", kafka, share)
	l.Note = fmt.Sprintf("input lines/s of the exactly-once wordcount on the partition source against the same job on the share-group "+
		"source (CommitWhenIdle(%v)); %d lines, %d words, 8 partitions, parallelism 1, 100 ms checkpoints; clocks stop at the last "+
		"output visible to read_committed; %s", eosIdleCommit, b.lines, b.words, l.Note)
	c := compared("eos-wordcount-kafka-ceiling", "records_per_s", "franz-go-partition-txn-loop", kafka, ceiling)
	c.Note = fmt.Sprintf("input lines/s of the exactly-once wordcount on the partition source against a hand-written one: a "+
		"read_committed partition consumer, a running count per word in a map, every count produced in one transaction per poll "+
		"(its clock stops at the last commit); measured in turn with eos-wordcount-kafka's runs; %s", c.Note)
	return []Line{l, c}, nil
}

// partitionTxnLoop is the hand-written exactly-once wordcount on partitions
// (run-th run: output and transactional id of its own): one consumer reads
// every partition of bench-lines read_committed from the start, and each
// poll's words are counted in a map and produced (key the word, value its
// running count) inside one transaction, committed before the next poll
// (the input's offsets are the loop's own: nothing else to commit). It
// returns the time from its start until the commit that completed the
// output, then checks the output (every word's values 1..n, in order) and
// deletes it.
func partitionTxnLoop(ctx context.Context, kb *kafkaBroker, run int, want map[string]int) (time.Duration, error) {
	out := fmt.Sprintf("bench-ptxn-out-%d", run)
	if err := createTopic(ctx, kb.adm, out); err != nil {
		return 0, err
	}
	defer deleteTopic(ctx, kb.adm, out)
	lines := 0
	ends, err := kb.adm.ListEndOffsets(ctx, "bench-lines")
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return 0, err
	}
	ends.Each(func(o kadm.ListedOffset) { lines += int(o.Offset) })
	cons, err := kgo.NewClient(kgo.SeedBrokers(kb.addr), kgo.ConsumeTopics("bench-lines"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.FetchMaxWait(limitFetchWait))
	if err != nil {
		return 0, err
	}
	defer cons.Close()
	prod, err := kgo.NewClient(kgo.SeedBrokers(kb.addr), kgo.DefaultProduceTopic(out),
		kgo.TransactionalID(fmt.Sprintf("bench-ptxn-%d", run)))
	if err != nil {
		return 0, err
	}
	defer prod.Close()
	counts := map[string]int64{}
	var produceErr error
	promise := func(_ *kgo.Record, err error) {
		if err != nil && produceErr == nil {
			produceErr = err
		}
	}
	start := time.Now()
	for read := 0; read < lines; {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if errs := fs.Errors(); len(errs) > 0 {
			return 0, fmt.Errorf("fetch %s/%d: %w", errs[0].Topic, errs[0].Partition, errs[0].Err)
		}
		if fs.NumRecords() == 0 {
			continue
		}
		if err := prod.BeginTransaction(); err != nil {
			return 0, err
		}
		fs.EachRecord(func(r *kgo.Record) {
			read++
			for _, w := range wordcount.Words(string(r.Value)) {
				counts[w]++
				prod.Produce(ctx, wordcount.CountRecord(out, wordcount.Count{Word: w, Count: counts[w]}), promise)
			}
		})
		if err := prod.Flush(ctx); err != nil {
			return 0, err
		}
		commit := kgo.TryCommit
		if produceErr != nil {
			commit = kgo.TryAbort
		}
		if err := prod.EndTransaction(ctx, commit); err != nil || produceErr != nil {
			return 0, errors.Join(fmt.Errorf("end transaction"), err, produceErr)
		}
	}
	elapsed := time.Since(start)
	recs, err := committed.Read(ctx, []string{kb.addr}, out)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", out, err)
	}
	if rep := wordcount.Check(recs, want); !rep.OK() {
		return 0, fmt.Errorf("partition loop output %s: %v", out, rep)
	}
	return elapsed, nil
}
