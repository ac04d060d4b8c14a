package sharegroup

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// This file is the share-group source's side of the watermark rule
// (runtime.SplitFrontier; docs/internals/event-time.md, "Watermarks from a
// share group"). A share group spreads every partition's records over
// every subtask, and redelivers records late by design, so a subtask's
// own records cannot tell it what nobody has fetched yet. Every subtask
// therefore reads the group's frontier from the brokers: on each input
// partition, the share start offset (below it every record is finished:
// ACCEPTed once its checkpoint completed, or archived) and the record at
// it. Every record a subtask has still to emit lies at or after its
// partition's start: records not delivered yet, records held by a lane
// (ours, a sibling's, a crashed attempt's), records released unprocessed
// or redelivered after a crash. The runtime feeds those records to one
// watermark generator per partition, so the watermark passes no record the
// group has not handed out and processed, for input in event-time order
// within the out-of-orderness bound on each partition. It needs no
// coordination: every subtask reads the same frontier, and a start offset
// only moves forward, so a reading never gets unsafe as it ages.
//
// The retry topic is left out of the frontier: a re-queued record (a
// record at the end of its delivery budget) comes back later than its
// partition's frontier by design, and may be late (on the late path,
// counted, never dropped).

var _ runtime.SplitFrontier[int] = (*Source[int])(nil)

// frontierMetadataAge is how long the frontier reader keeps the topics'
// metadata (partitions, leaders) before it asks again: new partitions join
// the frontier within it, and a failed reading asks again at once.
const frontierMetadataAge = 5 * time.Second

// frontierBack is how far below a caught-up partition's start offset the
// reader looks for the partition's last record (a transaction marker, or
// aborted records, may sit right below the start).
const frontierBack = 64

// splitName names a partition as a runtime split: "topic/partition".
func splitName(tp acklog.TopicPartition) string {
	return tp.Topic + "/" + strconv.Itoa(int(tp.Partition))
}

func compareTP(a, b acklog.TopicPartition) int {
	return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
}

// partFrontier is what the reader last read of one partition.
type partFrontier struct {
	start int64 // share start offset
	f     runtime.Frontier[*kgo.Record]
}

// Frontier implements runtime.SplitFrontier: the latest reading of the
// frontier loop (version 0 until its first), each frontier record decoded.
// The first call after Open starts the loop: a job without a watermark
// strategy never reads the frontier. Task goroutine.
func (s *Source[T]) Frontier() (int64, []runtime.Frontier[T]) {
	if s.cfg.ownWatermarks {
		return -1, nil
	}
	if s.frontierCtx == nil {
		return 0, nil // not open yet
	}
	s.startFrontier.Do(func() {
		s.fwg.Add(1)
		go func() {
			defer s.fwg.Done()
			s.frontierLoop(s.frontierCtx)
		}()
	})
	s.fmu.Lock()
	v, raw := s.fversion, s.fsplits
	s.fmu.Unlock()
	if v == s.fdecoded {
		return v, s.fcache
	}
	out := make([]runtime.Frontier[T], 0, len(raw))
	for _, f := range raw {
		d := runtime.Frontier[T]{Split: f.Split, Pending: f.Pending}
		for _, r := range f.Records {
			// An undecodable record (dead-lettered when delivered)
			// tells nothing of event time.
			if val, err := s.decode(r.Value); err == nil {
				d.Records = append(d.Records, runtime.FrontierRecord[T]{Offset: r.Offset, Value: val, Timestamp: r.Timestamp})
			}
		}
		out = append(out, d)
	}
	s.fdecoded, s.fcache = v, out
	return v, out
}

// AlignSplits implements runtime.SplitFrontier: every lane pauses the
// partitions ahead before its next fetch (alignLane). Task goroutine.
func (s *Source[T]) AlignSplits(ahead []string) {
	want := map[string][]int32{}
	for _, name := range ahead {
		i := strings.LastIndexByte(name, '/')
		p, err := strconv.ParseInt(name[i+1:], 10, 32)
		if i < 0 || err != nil {
			continue
		}
		want[name[:i]] = append(want[name[:i]], int32(p))
	}
	s.fmu.Lock()
	s.ahead = want
	s.fmu.Unlock()
	if len(ahead) > 0 {
		s.log.Debug("watermark alignment: pausing partitions ahead", zap.Strings("partitions", ahead))
	}
	for _, l := range s.lanes {
		l.poke()
	}
}

// alignLane makes lane l's client fetch every partition but those ahead
// (AlignSplits). On the lane's goroutine, before each poll. Pausing a
// partition releases what the client prefetched of it (kgo), a delivery
// each, once per pause: the runtime's hysteresis keeps pauses rare.
func (s *Source[T]) alignLane(l *lane) {
	s.fmu.Lock()
	want := s.ahead
	s.fmu.Unlock()
	if maps.EqualFunc(want, l.paused, slices.Equal) {
		return
	}
	if len(l.paused) > 0 {
		l.cl.ResumeFetchPartitions(l.paused)
	}
	if len(want) > 0 {
		l.cl.PauseFetchPartitions(want)
	}
	l.paused = want
}

// frontierLoop reads the group's frontier every frontierEvery until ctx
// ends (Source.Open starts it when the job has a watermark strategy).
func (s *Source[T]) frontierLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.frontierEvery)
	defer t.Stop()
	prev := map[acklog.TopicPartition]partFrontier{}
	warned := time.Time{}
	var md kadm.Metadata // the topics' partitions and leaders, read again every frontierMetadataAge or after a failure
	var mdAt time.Time
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var err error
		if time.Since(mdAt) >= frontierMetadataAge {
			if md, err = kadm.NewClient(s.admin).Metadata(rctx, s.cfg.topics...); err == nil {
				mdAt = time.Now()
			} else {
				err = fmt.Errorf("metadata: %w", err)
			}
		}
		var next map[acklog.TopicPartition]partFrontier
		if err == nil {
			if next, err = s.readFrontier(rctx, prev, md); err != nil {
				mdAt = time.Time{} // a leader may have moved
			}
		}
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			if time.Since(warned) > time.Minute {
				warned = time.Now()
				s.log.Warn("reading the share group's frontier failed; the watermark waits", zap.Error(err))
			}
		default:
			prev = next
			splits := make([]runtime.Frontier[*kgo.Record], 0, len(next))
			for _, tp := range slices.SortedFunc(maps.Keys(next), compareTP) {
				splits = append(splits, next[tp].f)
			}
			s.fmu.Lock()
			s.fversion++
			s.fsplits = splits
			s.fmu.Unlock()
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// readFrontier reads the frontier of every partition of the source's
// topics: its share start offset (the log start offset for a partition
// the group has not read yet, as share.auto.offset.reset=earliest starts
// there), then, for each partition whose start moved since prev, the first
// committed record at or after it (pending) or, if there is none up to the
// last stable offset, the last one below it (caught up).
func (s *Source[T]) readFrontier(ctx context.Context, prev map[acklog.TopicPartition]partFrontier, md kadm.Metadata) (map[acklog.TopicPartition]partFrontier, error) {
	starts, err := StartOffsets(ctx, s.admin, s.cfg.group)
	if err != nil {
		return nil, err
	}
	adm := kadm.NewClient(s.admin)
	var unstarted []string
	for _, td := range md.Topics {
		for p := range td.Partitions {
			if _, ok := starts[acklog.TopicPartition{Topic: td.Topic, Partition: p}]; !ok {
				unstarted = append(unstarted, td.Topic)
				break
			}
		}
	}
	if len(unstarted) > 0 {
		ls, err := adm.ListStartOffsets(ctx, unstarted...)
		if err != nil {
			return nil, fmt.Errorf("list log start offsets: %w", err)
		}
		ls.Each(func(o kadm.ListedOffset) {
			tp := acklog.TopicPartition{Topic: o.Topic, Partition: o.Partition}
			if _, ok := starts[tp]; !ok && o.Err == nil && s.cfg.resetEarliest {
				starts[tp] = o.Offset
			}
		})
	}
	next := map[acklog.TopicPartition]partFrontier{}
	probe := map[int32]map[acklog.TopicPartition]int64{} // leader -> partition -> fetch offset
	ids := map[string][16]byte{}
	for _, td := range md.Topics {
		if td.Err != nil {
			return nil, fmt.Errorf("metadata of %s: %w", td.Topic, td.Err)
		}
		ids[td.Topic] = td.ID
		for p, pd := range td.Partitions {
			tp := acklog.TopicPartition{Topic: td.Topic, Partition: p}
			start, ok := starts[tp]
			if !ok {
				// Not read yet, from the log end (StartFromLatest):
				// nothing before it is the group's.
				next[tp] = partFrontier{start: -1, f: runtime.Frontier[*kgo.Record]{Split: splitName(tp)}}
				continue
			}
			if old, ok := prev[tp]; ok && old.start == start && old.f.Pending && len(old.f.Records) > 0 {
				next[tp] = old // the same record is still the earliest unfinished one
				continue
			}
			if probe[pd.Leader] == nil {
				probe[pd.Leader] = map[acklog.TopicPartition]int64{}
			}
			probe[pd.Leader][tp] = start
		}
	}
	for leader, parts := range probe {
		got, err := s.fetchFrontier(ctx, leader, ids, parts, prev)
		if err != nil {
			return nil, err
		}
		maps.Copy(next, got)
	}
	return next, nil
}

// fetchFrontier reads the frontier of parts (partition -> share start
// offset), led by broker leader, read_committed: the first record at or
// after the start; for a partition with none below its last stable offset,
// the last record in the frontierBack offsets below the start (a second
// fetch, unless prev read it at the same start). A pending partition whose
// first committed record is beyond what one fetch returns is pending and
// unknown: its watermark waits.
func (s *Source[T]) fetchFrontier(ctx context.Context, leader int32, ids map[string][16]byte, parts map[acklog.TopicPartition]int64,
	prev map[acklog.TopicPartition]partFrontier) (map[acklog.TopicPartition]partFrontier, error) {
	first, lso, err := s.fetchAt(ctx, leader, ids, parts)
	if err != nil {
		return nil, err
	}
	out := map[acklog.TopicPartition]partFrontier{}
	back := map[acklog.TopicPartition]int64{}
	for tp, start := range parts {
		f := runtime.Frontier[*kgo.Record]{Split: splitName(tp), Pending: true}
		switch recs := first[tp]; {
		case len(recs) > 0:
			f.Records = frontierRecords(recs[:1])
		case lso[tp] <= start:
			f.Pending = false
			if old, ok := prev[tp]; ok && old.start == start && !old.f.Pending {
				f = old.f
			} else if start > 0 {
				back[tp] = max(0, start-frontierBack)
			}
		}
		out[tp] = partFrontier{start: start, f: f}
	}
	if len(back) == 0 {
		return out, nil
	}
	last, _, err := s.fetchAt(ctx, leader, ids, back)
	if err != nil {
		return nil, err
	}
	for tp, recs := range last {
		pf := out[tp]
		pf.f.Records = frontierRecords(slices.DeleteFunc(recs, func(r *kgo.Record) bool { return r.Offset >= pf.start }))
		out[tp] = pf
	}
	return out, nil
}

// frontierRecords wraps Kafka records as frontier records.
func frontierRecords(recs []*kgo.Record) []runtime.FrontierRecord[*kgo.Record] {
	out := make([]runtime.FrontierRecord[*kgo.Record], len(recs))
	for i, r := range recs {
		out[i] = runtime.FrontierRecord[*kgo.Record]{Offset: r.Offset, Value: r, Timestamp: r.Timestamp.UnixMilli()}
	}
	return out
}

// fetchAt sends one read_committed Fetch to broker leader for parts
// (partition -> offset) and returns each partition's committed data
// records and its last stable offset. An offset below the log start (the
// log was truncated) reads nothing: the partition then looks caught up
// until the group's start moves.
func (s *Source[T]) fetchAt(ctx context.Context, leader int32, ids map[string][16]byte, parts map[acklog.TopicPartition]int64) (map[acklog.TopicPartition][]*kgo.Record, map[acklog.TopicPartition]int64, error) {
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxBytes = 4 << 20
	req.IsolationLevel = 1 // read_committed
	req.SessionEpoch = -1  // a full fetch, no fetch session
	req.MaxWaitMillis = 0  // answer at once: an empty partition is caught up
	req.MinBytes = 0
	byTopic := map[string][]acklog.TopicPartition{}
	for tp := range parts {
		byTopic[tp.Topic] = append(byTopic[tp.Topic], tp)
	}
	byID := map[[16]byte]string{}
	for _, t := range slices.Sorted(maps.Keys(byTopic)) {
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic, rt.TopicID = t, ids[t]
		byID[ids[t]] = t
		for _, tp := range byTopic[t] {
			rp := kmsg.NewFetchRequestTopicPartition()
			rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = tp.Partition, parts[tp], 256<<10
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	kresp, err := s.admin.Broker(int(leader)).Request(ctx, req)
	if err != nil {
		return nil, nil, fmt.Errorf("fetch the frontier from broker %d: %w", leader, err)
	}
	resp := kresp.(*kmsg.FetchResponse)
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, nil, fmt.Errorf("fetch the frontier from broker %d: %w", leader, err)
	}
	recs := map[acklog.TopicPartition][]*kgo.Record{}
	lso := map[acklog.TopicPartition]int64{}
	var errs []error
	for i := range resp.Topics {
		rt := &resp.Topics[i]
		t := rt.Topic
		if t == "" {
			t = byID[rt.TopicID]
		}
		for j := range rt.Partitions {
			rp := &rt.Partitions[j]
			tp := acklog.TopicPartition{Topic: t, Partition: rp.Partition}
			off, ok := parts[tp]
			if !ok {
				continue
			}
			err := kerr.ErrorForCode(rp.ErrorCode)
			if errors.Is(err, kerr.OffsetOutOfRange) {
				lso[tp] = off
				continue
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("fetch %s at %d: %w", tp, off, err))
				continue
			}
			fp, _ := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{Offset: off, IsolationLevel: kgo.ReadCommitted(),
				Topic: t, Partition: rp.Partition}, rp, kgo.DefaultDecompressor(), nil)
			if fp.Err != nil {
				errs = append(errs, fmt.Errorf("decode %s at %d: %w", tp, off, fp.Err))
				continue
			}
			recs[tp] = fp.Records
			lso[tp] = rp.LastStableOffset
			if lso[tp] < 0 {
				lso[tp] = rp.HighWatermark
			}
		}
	}
	return recs, lso, errors.Join(errs...)
}
