package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/input"
	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/kafkatxn/committed"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sources/sharegroup"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// EOSWordcount measures the exactly-once wordcount (share group ->
// transactional sink, mini cluster, 100 ms checkpoints plus readiness
// triggers and sharegroup.CommitWhenIdle(5 ms), so that the last batch is
// not left waiting for the interval) against a hand-written franz-go
// at-least-once share-consume, count, produce loop (2 consumers, flush per
// poll), on the same in-process
// broker and the same input, in input lines per second, alternating the two
// sides (3 runs each, 2 with Quick; each run reads the input with a share
// group of its own and writes a topic of its own).
//
// Both clocks stop when the output is durable and visible: Weir's when the
// last output record became visible to read_committed readers (the first
// sample of the output's last stable offsets past every partition's last
// record, see visibleAt), the baseline's at its last produce
// acknowledgement. Both outputs are then read back and checked record by
// record, outside the timed windows.
//
// Between them it measures the ceiling of any wordcount on this machine
// and broker (limit-wordcount, wordcountCeiling), so the report shows how
// far above the loop any wordcount could go at all.
//
// It also reports the largest number of records a source subtask held per
// partition against the broker's cap (share-inflight), over all runs.
func EOSWordcount(ctx context.Context, cfg Config) ([]Line, error) {
	b, err := startEOSBench(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer b.kb.Close()
	var mu sync.Mutex
	maxHeld, limit := 0, 0
	observe := sharegroup.ObserveInFlight(func(held map[acklog.TopicPartition]int, lim int) {
		mu.Lock()
		defer mu.Unlock()
		limit = lim
		for _, n := range held {
			maxHeld = max(maxHeld, n)
		}
	})
	vs, err := b.alternate(cfg,
		b.side("weir", func(i int) (time.Duration, error) {
			return weirEOSWordcount(ctx, b.kb, i, b.want, b.words, input.ShareGroup, observe, sharegroup.CommitWhenIdle(eosIdleCommit))
		}),
		b.side("baseline", func(i int) (time.Duration, error) { return shareLoop(ctx, b.kb, i, b.want, b.words) }),
		b.side("ceiling", func(i int) (time.Duration, error) { return wordcountCeiling(ctx, b.kb, i, b.words) }))
	if err != nil {
		return nil, err
	}
	weir, base, ceiling := vs[0], vs[1], vs[2]
	l := compared("eos-wordcount", "records_per_s", "franz-go-share-loop", weir, base)
	l.Note = fmt.Sprintf("input lines/s; %d lines, %d words, 8 partitions; weir: 100 ms checkpoints, CommitWhenIdle(%v); "+
		"clocks stop at the last output visible to read_committed (weir) and at the last produce ack (baseline); %s", b.lines, b.words, eosIdleCommit, l.Note)
	lim := compared("limit-wordcount", "records_per_s", "franz-go-share-loop", ceiling, base)
	lim.Note = fmt.Sprintf("input lines/s of the ceiling of any wordcount on this machine and broker: 2 share consumers "+
		"that split each line and produce one record per word asynchronously (no counting, no transaction, no ack waited for), "+
		"measured in turn with eos-wordcount's runs; ratio: ceiling / loop; median of %d runs; ceiling %s", len(ceiling), rates(ceiling))
	mu.Lock()
	defer mu.Unlock()
	return []Line{l, lim,
		{Bench: "share-inflight", Metric: "max_held_per_partition", Value: float64(maxHeld),
			Baseline: "group.share.partition.max.record.locks", BaselineValue: float64(limit), Ratio: float64(maxHeld) / float64(max(limit, 1))},
	}, nil
}

// eosBench is what eos-wordcount and eos-wordcount-kafka share: an
// in-process broker with the corpus produced to bench-lines, the counts it
// must give (want, words in all), and the size and number of runs.
type eosBench struct {
	kb          *kafkaBroker
	lines, runs int
	want        map[string]int
	words       int
}

// startEOSBench starts the broker and produces the corpus; the caller
// closes b.kb.
func startEOSBench(ctx context.Context, cfg Config) (*eosBench, error) {
	b := &eosBench{lines: cfg.sizeOf(200_000, 60_000, 3_000), runs: cfg.runsOf(3, 2)}
	kb, err := startBroker(ctx)
	if err != nil {
		return nil, err
	}
	corpus := Corpus(3, b.lines, 6, 5_000)
	b.kb, b.want = kb, wordcount.Expected(corpus)
	for _, n := range b.want {
		b.words += n
	}
	cfg.progress("producing %d lines", b.lines)
	if err := produceCorpus(ctx, kb.addr, "bench-lines", corpus); err != nil {
		kb.Close()
		return nil, err
	}
	return b, nil
}

// side is a side measured in input lines per second, run timing its i-th
// run.
func (b *eosBench) side(name string, run func(i int) (time.Duration, error)) side {
	return side{name, func(i int) (float64, error) {
		el, err := run(i)
		return float64(b.lines) / el.Seconds(), err
	}}
}

// alternate measures the sides in turn, b.runs times.
func (b *eosBench) alternate(cfg Config, sides ...side) ([][]float64, error) {
	return alternateSides(b.runs, func(side string, i int) { cfg.progress("run %d/%d: %s", i+1, b.runs, side) }, sides...)
}

// eosIdleCommit is the CommitWhenIdle time of eos-wordcount's Weir runs.
const eosIdleCommit = 5 * time.Millisecond

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

// Sampling of the output's last stable offsets while the exactly-once job
// runs: slowly until they could hold nearly every record (each sample is a
// ListOffsets request the job's run pays for), then often, so the moment
// the output became visible is known to within lsoFine.
const (
	lsoCoarse = 50 * time.Millisecond
	lsoFine   = 5 * time.Millisecond
	// lsoStable is how long the last stable offsets must stand still before
	// the output is read back to see whether it is complete.
	lsoStable = 300 * time.Millisecond
)

// weirEOSWordcount runs the exactly-once wordcount on source (run-th run:
// group and output of its own; opts are the share-group source's) until its
// committed output holds words records, and returns the time from its start
// until that output was visible. It then checks the output with
// wordcount.Check and deletes it.
func weirEOSWordcount(ctx context.Context, kb *kafkaBroker, run int, want map[string]int, words int, source string, opts ...sharegroup.Opt) (time.Duration, error) {
	out := fmt.Sprintf("bench-weir-%s-out-%d", source, run)
	job, err := wordcount.BuildWith(runtime.Params{"brokers": kb.addr, "input": "bench-lines", "output": out,
		"group": fmt.Sprintf("bench-weir-%s-%d", source, run), "guarantee": "exactly-once", "source": source}, opts...)
	if err != nil {
		return 0, err
	}
	// Created here, as the job would (broker defaults), so the sampler's
	// client never caches it as unknown.
	if err := createTopic(ctx, kb.adm, out); err != nil {
		return 0, err
	}
	defer deleteTopic(ctx, kb.adm, out)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	smp := &lsoSampler{adm: kb.adm, topic: out, fineFrom: int64(words) * 9 / 10}
	start := time.Now()
	go func() {
		_, err := runtime.NewMiniCluster(runtime.CheckpointInterval(100*time.Millisecond), runtime.MinPause(0)).Run(rctx, job)
		done <- err
	}()
	sctx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		smp.run(sctx, start)
	}()
	defer func() {
		stopSampling()
		<-sampled
	}()
	var checked int64
	for {
		select {
		case err := <-done:
			return 0, fmt.Errorf("wordcount stopped: %w", err)
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(lsoCoarse):
		}
		sum, stable := smp.latest()
		if sum < int64(words) || stable < lsoStable || sum == checked {
			continue
		}
		// Nothing became visible for lsoStable: read the output back.
		checked = sum
		recs, err := committed.Read(ctx, []string{kb.addr}, out)
		if err != nil {
			return 0, fmt.Errorf("read %s: %w", out, err)
		}
		if len(recs) < words {
			continue // a pause, not the end
		}
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			return 0, fmt.Errorf("%w", err)
		}
		if rep := wordcount.Check(recs, want); !rep.OK() {
			return 0, fmt.Errorf("weir output %s: %v", out, rep)
		}
		stopSampling()
		<-sampled
		el, ok := visibleAt(smp.samples, lastOffsets(recs))
		if !ok {
			return 0, fmt.Errorf("weir output %s: no sample of its last stable offsets shows every record", out)
		}
		return el, nil
	}
}

// lsoSample is the last stable offset of each partition of a topic, at
// time at since the run started.
type lsoSample struct {
	at  time.Duration
	lso map[int32]int64
}

// lsoSampler samples a topic's last stable offsets (lsoCoarse apart until
// their sum reaches fineFrom, then lsoFine).
type lsoSampler struct {
	adm      *kadm.Client
	topic    string
	fineFrom int64

	mu        sync.Mutex
	samples   []lsoSample
	sum       int64     // of the latest sample
	changedAt time.Time // when sum last changed
}

func (s *lsoSampler) run(ctx context.Context, start time.Time) {
	for {
		if los, err := s.adm.ListCommittedOffsets(ctx, s.topic); err == nil {
			smp := lsoSample{at: time.Since(start), lso: map[int32]int64{}}
			var sum int64
			los.Each(func(o kadm.ListedOffset) {
				if o.Err == nil {
					smp.lso[o.Partition] = o.Offset
					sum += o.Offset
				}
			})
			s.mu.Lock()
			s.samples = append(s.samples, smp)
			if sum != s.sum || s.changedAt.IsZero() {
				s.sum, s.changedAt = sum, time.Now()
			}
			s.mu.Unlock()
		}
		every := lsoCoarse
		if s.sumNow() >= s.fineFrom {
			every = lsoFine
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

func (s *lsoSampler) sumNow() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sum
}

// latest returns the sum of the latest sample's last stable offsets (an
// upper bound of the committed records: transaction markers take offsets
// too) and for how long it has not changed.
func (s *lsoSampler) latest() (sum int64, stable time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changedAt.IsZero() {
		return 0, 0
	}
	return s.sum, time.Since(s.changedAt)
}

// visibleAt returns the time of the first sample whose last stable offset
// is past last[p] in every partition p: from then on a read_committed
// reader sees every record up to last. false if no sample is.
func visibleAt(samples []lsoSample, last map[int32]int64) (time.Duration, bool) {
next:
	for _, s := range samples {
		for p, o := range last {
			if s.lso[p] <= o {
				continue next
			}
		}
		return s.at, true
	}
	return 0, false
}

// lastOffsets returns the offset of the last record of each partition in
// recs.
func lastOffsets(recs []*kgo.Record) map[int32]int64 {
	last := map[int32]int64{}
	for _, r := range recs {
		if o, ok := last[r.Partition]; !ok || r.Offset > o {
			last[r.Partition] = r.Offset
		}
	}
	return last
}

// shareLoop is the hand-written baseline (run-th run: group and output of
// its own): 2 share consumers, each polling, counting words in a shared
// map, producing every running count, flushing the producer, then
// acknowledging the poll (at-least-once; a line delivered again is
// skipped, see firstDeliveries). It returns the time from its
// start to the produce acknowledgement that completed the output. It then
// checks the output (every word's values are 1..n, in any order: the two
// consumers' produce calls interleave) and deletes it.
func shareLoop(ctx context.Context, kb *kafkaBroker, run int, want map[string]int, words int) (time.Duration, error) {
	group, out := fmt.Sprintf("bench-loop-%d", run), fmt.Sprintf("bench-loop-out-%d", run)
	if err := sharegroup.SetGroupConfig(ctx, kb.cl, group, "share.auto.offset.reset", "earliest"); err != nil {
		return 0, err
	}
	defer deleteTopic(ctx, kb.adm, out)
	prod, err := kgo.NewClient(kgo.SeedBrokers(kb.addr), kgo.DefaultProduceTopic(out), kgo.AllowAutoTopicCreation())
	if err != nil {
		return 0, err
	}
	defer prod.Close()
	var mu sync.Mutex
	counts := map[string]int64{}
	var produced atomic.Int64
	var elapsed atomic.Int64 // time.Duration of the completing ack
	var firsts firstDeliveries
	start := time.Now()
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		cons, err := kgo.NewClient(kgo.SeedBrokers(kb.addr), kgo.ShareGroup(group), kgo.ConsumeTopics("bench-lines"), kgo.ShareMaxRecords(2000))
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
					if !firsts.first(r) {
						return // counted already
					}
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
				if n := produced.Add(int64(len(batch))); n >= int64(words) && n-int64(len(batch)) < int64(words) {
					elapsed.Store(int64(time.Since(start)))
				}
				cons.MarkAcks(kgo.AckAccept)
				if err := cons.FlushAcks(lctx); err != nil && lctx.Err() == nil {
					errs <- err
					return
				}
				if produced.Load() >= int64(words) {
					cancel()
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return 0, err
	default:
	}
	if produced.Load() < int64(words) {
		return 0, fmt.Errorf("produced %d of %d counts: %w", produced.Load(), words, ctx.Err())
	}
	recs, err := committed.Read(ctx, []string{kb.addr}, out)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", out, err)
	}
	if err := checkCounts(recs, want); err != nil {
		return 0, fmt.Errorf("baseline output %s: %w", out, err)
	}
	return time.Duration(elapsed.Load()), nil
}

// firstDeliveries tells a record's first delivery from a later one. A
// share group can deliver a record again (a rebalance of the baselines' two
// consumers released it; under -race it happened): the baselines, which
// have no exactly-once machinery, skip it, so that their output stays
// checkable and their clocks stop at the right record count. A bit per
// offset and partition: it is on the baselines' per-line path (a map of
// offsets cost about 200 ns a line, this about 20).
type firstDeliveries struct {
	mu   sync.Mutex
	seen map[int32][]uint64 // partition -> offset bitmap
}

func (f *firstDeliveries) first(r *kgo.Record) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seen == nil {
		f.seen = map[int32][]uint64{}
	}
	bits := f.seen[r.Partition]
	w, bit := int(r.Offset/64), uint64(1)<<(r.Offset%64)
	if w >= len(bits) {
		bits = append(bits, make([]uint64, w+1-len(bits))...)
		f.seen[r.Partition] = bits
	}
	if bits[w]&bit != 0 {
		return false
	}
	bits[w] |= bit
	return true
}

// checkCounts checks that recs hold, for every word of want, the values
// 1..n (n its occurrences) once each, in any order, and nothing else.
func checkCounts(recs []*kgo.Record, want map[string]int) error {
	got := map[string][]int{}
	for _, r := range recs {
		n, err := strconv.Atoi(string(r.Value))
		if err != nil {
			return fmt.Errorf("word %q: value %q at %d/%d is not a count", r.Key, r.Value, r.Partition, r.Offset)
		}
		got[string(r.Key)] = append(got[string(r.Key)], n)
	}
	var problems []error
	for w := range got {
		if _, ok := want[w]; !ok {
			problems = append(problems, fmt.Errorf("word %q was never in the input", w))
		}
	}
	for w, n := range want {
		vs := slices.Sorted(slices.Values(got[w]))
		ok := len(vs) == n
		for i := 0; ok && i < n; i++ {
			ok = vs[i] == i+1
		}
		if !ok {
			problems = append(problems, fmt.Errorf("word %q: %d values (sorted, first %v), want each of 1..%d once", w, len(vs), vs[:min(len(vs), 10)], n))
		}
	}
	if len(problems) > 5 {
		problems = append(problems[:5], fmt.Errorf("and %d more", len(problems)-5))
	}
	return errors.Join(problems...)
}

// wordcountCeiling is the most a wordcount could do on this broker and
// machine (run-th run: group and output of its own): 2 share consumers,
// each polling (which ACCEPTs the previous poll), splitting every line as
// the wordcount does and producing one record per word (the word, value
// "1") asynchronously from one client, with franz-go's defaults as the
// loop. No counting, no ordering, no transaction, no acknowledgement
// waited for before the next poll: everything a wordcount must do to move
// the data, and nothing else (but skipping a line delivered again, as the
// loop does: firstDeliveries). It returns
// the time from its start to the acknowledgement of the last record, then
// checks that every word was produced and acknowledged once per occurrence
// and deletes the output.
func wordcountCeiling(ctx context.Context, kb *kafkaBroker, run int, words int) (time.Duration, error) {
	group, out := fmt.Sprintf("bench-ceiling-%d", run), fmt.Sprintf("bench-ceiling-out-%d", run)
	if err := sharegroup.SetGroupConfig(ctx, kb.cl, group, "share.auto.offset.reset", "earliest"); err != nil {
		return 0, err
	}
	if err := createTopic(ctx, kb.adm, out); err != nil {
		return 0, err
	}
	defer deleteTopic(ctx, kb.adm, out)
	prod, err := kgo.NewClient(kgo.SeedBrokers(kb.addr), kgo.DefaultProduceTopic(out))
	if err != nil {
		return 0, err
	}
	defer prod.Close()
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		produced, acked atomic.Int64
		elapsed         atomic.Int64 // time.Duration of the last acknowledgement
		firstErr        atomic.Pointer[error]
	)
	one := []byte("1")
	start := time.Now()
	promise := func(_ *kgo.Record, err error) {
		if err != nil {
			firstErr.CompareAndSwap(nil, &err)
			cancel()
			return
		}
		if acked.Add(1) == int64(words) {
			elapsed.Store(int64(time.Since(start)))
			cancel()
		}
	}
	var firsts firstDeliveries
	var wg sync.WaitGroup
	for range 2 {
		cons, err := kgo.NewClient(kgo.SeedBrokers(kb.addr), kgo.ShareGroup(group), kgo.ConsumeTopics("bench-lines"),
			kgo.ShareMaxRecords(2000), kgo.FetchMaxWait(limitFetchWait))
		if err != nil {
			return 0, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cons.Close()
			for lctx.Err() == nil && produced.Load() < int64(words) {
				cons.PollRecords(lctx, 2000).EachRecord(func(r *kgo.Record) {
					if !firsts.first(r) {
						return // words produced already
					}
					for _, w := range wordcount.Words(string(r.Value)) {
						produced.Add(1)
						prod.Produce(lctx, &kgo.Record{Key: []byte(w), Value: one}, promise)
					}
				})
			}
		}()
	}
	wg.Wait()
	if err := prod.Flush(ctx); err != nil {
		return 0, fmt.Errorf("flush: %w", err)
	}
	if err := firstErr.Load(); err != nil {
		return 0, fmt.Errorf("produce: %w", *err)
	}
	if n := acked.Load(); n != int64(words) || produced.Load() != int64(words) {
		return 0, fmt.Errorf("produced %d and acknowledged %d of %d words: %w", produced.Load(), n, words, ctx.Err())
	}
	return time.Duration(elapsed.Load()), nil
}
