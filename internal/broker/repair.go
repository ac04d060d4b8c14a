package broker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// Repair is what Start did to a data dir whose previous broker did not stop
// cleanly (Unclean), or the group configs it re-applied after any stop.
type Repair struct {
	// Unclean is true when the previous run on the data dir did not stop
	// cleanly (crash, SIGKILL, power loss).
	Unclean bool
	// GroupConfigs are the groups whose journaled configs were re-applied.
	GroupConfigs []string
	// ShareGroups are the share groups whose partition state was rebuilt
	// from the journal.
	ShareGroups []string
	// ShareRecordsRedelivered counts records put back for redelivery (at a
	// delivery count above 1) by the share-state rebuild.
	ShareRecordsRedelivered int64
	// AbortedTxns are the transactions the crash left open (producer id,
	// epoch, partitions), now aborted with markers.
	AbortedTxns []OrphanTxn
}

// OrphanTxn is a transaction a crash left without a marker.
type OrphanTxn struct {
	ProducerID int64
	Epoch      int16
	// FirstOffsets are the offsets of its first record, by topic and
	// partition.
	FirstOffsets map[string]map[int32]int64
	// FirstRecord is the timestamp of its earliest record.
	FirstRecord time.Time
}

// Repaired returns what Start repaired in the data dir (zero without one).
func (b *Broker) Repaired() Repair { return b.repair }

// repairer keeps the journal up to date while the broker runs.
type repairer struct {
	dir string
	cl  *kgo.Client // through the internal listener
	log *zap.Logger

	mu      sync.Mutex
	j       journal
	written journal
	dirty   map[string]bool // groups whose configs changed, to re-read

	kick chan struct{}
	stop chan struct{}
	done chan struct{}
}

// shareJournalInterval is how often the share-partition start offsets are
// journaled. A crash loses at most what was acknowledged since; those
// records are redelivered (at delivery count > 1), never skipped.
const shareJournalInterval = 200 * time.Millisecond

func newRepairer(dir string, cl *kgo.Client, log *zap.Logger) (*repairer, error) {
	j, err := readJournal(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStart, err)
	}
	return &repairer{
		dir: dir, cl: cl, log: log, j: j, written: j.clone(), dirty: map[string]bool{},
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}, nil
}

// install adds the control hooks that journal what kfake does not persist
// as it goes.
func (r *repairer) install(c *kfake.Cluster, autoCreate bool) {
	if autoCreate {
		// A topic auto-created by a metadata request is not written to
		// topics.json: create it first through CreateTopic, which is.
		c.ControlKey(kmsg.Metadata.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			m := req.(*kmsg.MetadataRequest)
			if !m.AllowAutoTopicCreation {
				return nil, nil, false
			}
			for _, t := range m.Topics {
				if t.Topic != nil && *t.Topic != "" {
					// Errors (exists, invalid name) are kfake's to report
					// in its own answer.
					_ = c.CreateTopic(*t.Topic, -1, nil)
				}
			}
			return nil, nil, false
		})
	}
	c.ControlKey(kmsg.IncrementalAlterConfigs.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		a := req.(*kmsg.IncrementalAlterConfigsRequest)
		if a.ValidateOnly {
			return nil, nil, false
		}
		for _, res := range a.Resources {
			if res.ResourceType != kmsg.ConfigResourceTypeGroupConfig {
				continue
			}
			// Journal as requested before kfake applies it, so nothing
			// acknowledged is lost; the journaler re-reads the group's
			// configs afterwards, dropping anything kfake refused.
			r.mu.Lock()
			m := r.j.GroupConfigs[res.ResourceName]
			if m == nil {
				m = map[string]string{}
				r.j.GroupConfigs[res.ResourceName] = m
			}
			for _, cfg := range res.Configs {
				switch {
				case cfg.Op == kmsg.IncrementalAlterConfigOpSet && cfg.Value != nil:
					m[cfg.Name] = *cfg.Value
				case cfg.Op == kmsg.IncrementalAlterConfigOpDelete:
					delete(m, cfg.Name)
				}
			}
			r.dirty[res.ResourceName] = true
			r.mu.Unlock()
		}
		if err := r.flush(); err != nil {
			r.log.Error("embedded broker: cannot journal group configs", zap.Error(err))
		}
		r.poke()
		return nil, nil, false
	})
	c.ControlKey(kmsg.AlterConfigs.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, res := range req.(*kmsg.AlterConfigsRequest).Resources {
			if res.ResourceType == kmsg.ConfigResourceTypeGroupConfig {
				r.mu.Lock()
				r.dirty[res.ResourceName] = true
				r.mu.Unlock()
				r.poke()
			}
		}
		return nil, nil, false
	})
}

func (r *repairer) poke() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// run journals share-partition start offsets every shareJournalInterval and
// re-reads changed group configs, until close.
func (r *repairer) run() {
	defer close(r.done)
	t := time.NewTicker(shareJournalInterval)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		case <-r.kick:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		go func() {
			select {
			case <-r.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		err := errors.Join(r.rereadGroupConfigs(ctx), r.observeShareStarts(ctx), r.flush())
		cancel()
		if err != nil && !errors.Is(err, context.Canceled) {
			r.log.Warn("embedded broker: journal update failed (retrying)", zap.Error(err))
		}
	}
}

func (r *repairer) close() {
	close(r.stop)
	<-r.done
}

// flush writes the journal if it changed.
func (r *repairer) flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if journalEqual(r.j, r.written) {
		return nil
	}
	if err := writeJournal(r.dir, r.j); err != nil {
		return err
	}
	r.written = r.j.clone()
	return nil
}

func journalEqual(a, b journal) bool {
	if len(a.GroupConfigs) != len(b.GroupConfigs) || len(a.ShareStart) != len(b.ShareStart) {
		return false
	}
	for g, m := range a.GroupConfigs {
		if !maps.Equal(m, b.GroupConfigs[g]) {
			return false
		}
	}
	for g, ts := range a.ShareStart {
		if len(ts) != len(b.ShareStart[g]) {
			return false
		}
		for t, ps := range ts {
			if !maps.Equal(ps, b.ShareStart[g][t]) {
				return false
			}
		}
	}
	return true
}

// rereadGroupConfigs replaces the journaled configs of changed groups with
// what the broker reports as set on them.
func (r *repairer) rereadGroupConfigs(ctx context.Context) error {
	r.mu.Lock()
	groups := slices.Sorted(maps.Keys(r.dirty))
	clear(r.dirty)
	r.mu.Unlock()
	if len(groups) == 0 {
		return nil
	}
	req := kmsg.NewPtrDescribeConfigsRequest()
	for _, g := range groups {
		res := kmsg.NewDescribeConfigsRequestResource()
		res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, g
		req.Resources = append(req.Resources, res)
	}
	resp, err := req.RequestWith(ctx, r.cl)
	if err != nil {
		r.mu.Lock()
		for _, g := range groups {
			r.dirty[g] = true
		}
		r.mu.Unlock()
		return fmt.Errorf("describe group configs: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, res := range resp.Resources {
		if kerr.ErrorForCode(res.ErrorCode) != nil {
			continue
		}
		m := map[string]string{}
		for _, c := range res.Configs {
			if c.Source == kmsg.ConfigSourceGroupConfig && c.Value != nil {
				m[c.Name] = *c.Value
			}
		}
		if len(m) == 0 {
			delete(r.j.GroupConfigs, res.ResourceName)
		} else {
			r.j.GroupConfigs[res.ResourceName] = m
		}
	}
	return nil
}

// observeShareStarts journals the start offset of every share partition.
func (r *repairer) observeShareStarts(ctx context.Context) error {
	lg := kmsg.NewPtrListGroupsRequest()
	lg.TypesFilter = []string{"share"}
	lresp, err := lg.RequestWith(ctx, r.cl)
	if err != nil {
		return fmt.Errorf("list share groups: %w", err)
	}
	var groups []string
	for _, g := range lresp.Groups {
		groups = append(groups, g.Group)
	}
	if len(groups) == 0 {
		return nil
	}
	described, err := kadm.NewClient(r.cl).DescribeShareGroupOffsets(ctx, groups...)
	if err != nil {
		return fmt.Errorf("describe share group offsets: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for g, d := range described {
		if d.Err != nil {
			continue
		}
		for t, ps := range d.Offsets {
			for p, o := range ps {
				if o.Err != nil || o.StartOffset < 0 {
					continue
				}
				ts := r.j.ShareStart[g]
				if ts == nil {
					ts = map[string]map[int32]int64{}
					r.j.ShareStart[g] = ts
				}
				if ts[t] == nil {
					ts[t] = map[int32]int64{}
				}
				ts[t][p] = o.StartOffset
			}
		}
	}
	return nil
}

// reapplyGroupConfigs sets every journaled group config on the cluster.
// After a clean stop kfake restored them itself; setting them again is a
// no-op.
func (r *repairer) reapplyGroupConfigs(c *kfake.Cluster) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	groups := slices.Sorted(maps.Keys(r.j.GroupConfigs))
	for _, g := range groups {
		c.SetGroupConfigs(g, r.j.GroupConfigs[g])
	}
	return groups
}

// repairShareGroups rebuilds the share-partition state a crash lost: each
// journaled share partition restarts at its journaled start offset
// (AlterShareGroupOffsets, as an administrator resetting the group would),
// and every record from there to the log end is acquired once and released,
// so it comes back at a delivery count above 1. A share consumer treats such
// a record as a redelivery and checks whether it was already processed (the
// source's ack-log lookup) instead of processing it again. The records
// acknowledged since the last journal entry are the ones redelivered;
// nothing is skipped.
//
// Partitions of a journaled group's topics that the journal has no entry for
// restart at the log start if the group resets to earliest, else as kfake
// decides (latest).
func (r *repairer) repairShareGroups(ctx context.Context, lockCap string) (groups []string, redelivered int64, err error) {
	r.mu.Lock()
	starts := r.j.clone()
	r.mu.Unlock()
	adm := kadm.NewClient(r.cl)
	for _, g := range slices.Sorted(maps.Keys(starts.ShareStart)) {
		topics := slices.Sorted(maps.Keys(starts.ShareStart[g]))
		begin, err := adm.ListStartOffsets(ctx, topics...)
		if err != nil {
			return groups, redelivered, fmt.Errorf("share group %s: list start offsets: %w", g, err)
		}
		end, err := adm.ListEndOffsets(ctx, topics...)
		if err != nil {
			return groups, redelivered, fmt.Errorf("share group %s: list end offsets: %w", g, err)
		}
		earliest := starts.GroupConfigs[g]["share.auto.offset.reset"] == "earliest"
		offsets := kadm.Offsets{}
		want := map[string]map[int32]int64{} // partitions to warm: [start, end)
		begin.Each(func(lo kadm.ListedOffset) {
			if lo.Err != nil {
				return
			}
			s, ok := starts.ShareStart[g][lo.Topic][lo.Partition]
			if !ok {
				if !earliest {
					return
				}
				s = lo.Offset
			}
			s = max(s, lo.Offset)
			offsets.Add(kadm.Offset{Topic: lo.Topic, Partition: lo.Partition, At: s, LeaderEpoch: -1})
			if e, ok := end.Lookup(lo.Topic, lo.Partition); ok && e.Err == nil && e.Offset > s {
				if want[lo.Topic] == nil {
					want[lo.Topic] = map[int32]int64{}
				}
				want[lo.Topic][lo.Partition] = e.Offset
			}
		})
		if len(offsets) == 0 {
			continue
		}
		resps, err := adm.AlterShareGroupOffsets(ctx, g, offsets)
		if err != nil {
			return groups, redelivered, fmt.Errorf("share group %s: reset start offsets: %w", g, err)
		}
		for t, ps := range resps {
			for p, perr := range ps {
				if perr != nil {
					return groups, redelivered, fmt.Errorf("share group %s: reset start offset of %s/%d: %w", g, t, p, perr)
				}
			}
		}
		n, err := r.redeliverOnce(ctx, g, topics, want, lockCap)
		redelivered += n
		if err != nil {
			return groups, redelivered, fmt.Errorf("share group %s: %w", g, err)
		}
		groups = append(groups, g)
	}
	return groups, redelivered, nil
}

// redeliverOnce joins group as a repair member, acquires every available
// record of want (up to the given end offsets) and releases them, so each
// counts one delivery. The per-partition lock cap is lifted meanwhile and
// restored to lockCap ("" for kfake's default) after.
func (r *repairer) redeliverOnce(ctx context.Context, group string, topics []string, want map[string]map[int32]int64, lockCap string) (int64, error) {
	if len(want) == 0 {
		return 0, nil
	}
	if err := r.setBrokerConfig(ctx, "group.share.partition.max.record.locks", strconv.Itoa(1<<30)); err != nil {
		return 0, err
	}
	defer func() {
		if err := r.setBrokerConfig(context.WithoutCancel(ctx), "group.share.partition.max.record.locks", lockCap); err != nil {
			r.log.Error("embedded broker: cannot restore group.share.partition.max.record.locks", zap.Error(err))
		}
	}()

	var idb [8]byte
	_, _ = rand.Read(idb[:])
	member := "weir-repair-" + hex.EncodeToString(idb[:]) // at most 36 characters
	hb := kmsg.NewPtrShareGroupHeartbeatRequest()
	hb.GroupID, hb.MemberID, hb.MemberEpoch, hb.SubscribedTopicNames = group, member, 0, topics
	var assigned []kmsg.ShareGroupHeartbeatResponseAssignmentTopicPartition
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err := hb.RequestWith(ctx, r.cl)
		if err != nil {
			return 0, fmt.Errorf("repair member join: %w", err)
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			return 0, fmt.Errorf("repair member join: %w", err)
		}
		hb.MemberEpoch, hb.SubscribedTopicNames = resp.MemberEpoch, nil
		if resp.Assignment != nil {
			assigned = resp.Assignment.TopicPartitions
		}
		n := 0
		for _, tp := range assigned {
			n += len(tp.Partitions)
		}
		if n > 0 || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	defer func() {
		leave := kmsg.NewPtrShareGroupHeartbeatRequest()
		leave.GroupID, leave.MemberID, leave.MemberEpoch = group, member, -1
		_, _ = leave.RequestWith(context.WithoutCancel(ctx), r.cl)
	}()

	names := map[[16]byte]string{}
	meta, err := kadm.NewClient(r.cl).ListTopics(ctx, topics...)
	if err != nil {
		return 0, fmt.Errorf("repair member metadata: %w", err)
	}
	for _, td := range meta {
		names[td.ID] = td.Topic
	}
	acquired := map[string]map[int32][][2]int64{}
	var total int64
	epoch := int32(0)
	for round := 0; ; round++ {
		req := kmsg.NewPtrShareFetchRequest()
		req.GroupID, req.MemberID = &group, &member
		req.ShareSessionEpoch = epoch
		req.MaxBytes, req.MaxRecords, req.MaxWaitMillis = 1<<30, 1<<30, 0
		req.ShareAcquireMode = 1 // record limit
		for _, tp := range assigned {
			rt := kmsg.NewShareFetchRequestTopic()
			rt.TopicID = tp.TopicID
			for _, p := range tp.Partitions {
				rp := kmsg.NewShareFetchRequestTopicPartition()
				rp.Partition, rp.PartitionMaxBytes = p, 1<<30
				rt.Partitions = append(rt.Partitions, rp)
			}
			req.Topics = append(req.Topics, rt)
		}
		resp, err := req.RequestWith(ctx, r.cl)
		if err != nil {
			return total, fmt.Errorf("repair fetch: %w", err)
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			return total, fmt.Errorf("repair fetch: %w", err)
		}
		epoch++
		got := int64(0)
		for _, rt := range resp.Topics {
			t := names[rt.TopicID]
			for _, rp := range rt.Partitions {
				for _, a := range rp.AcquiredRecords {
					end, ok := want[t][rp.Partition]
					if !ok || a.FirstOffset >= end {
						continue
					}
					if acquired[t] == nil {
						acquired[t] = map[int32][][2]int64{}
					}
					acquired[t][rp.Partition] = append(acquired[t][rp.Partition], [2]int64{a.FirstOffset, a.LastOffset})
					got += a.LastOffset - a.FirstOffset + 1
				}
			}
		}
		total += got
		if got == 0 || round > 1000 {
			break
		}
	}
	// Release everything acquired, in one request, and close the session.
	ack := kmsg.NewPtrShareAcknowledgeRequest()
	ack.GroupID, ack.MemberID, ack.ShareSessionEpoch = &group, &member, epoch
	for _, tp := range assigned {
		t := names[tp.TopicID]
		if len(acquired[t]) == 0 {
			continue
		}
		at := kmsg.NewShareAcknowledgeRequestTopic()
		at.TopicID = tp.TopicID
		for _, p := range slices.Sorted(maps.Keys(acquired[t])) {
			ap := kmsg.NewShareAcknowledgeRequestTopicPartition()
			ap.Partition = p
			for _, rg := range acquired[t][p] {
				b := kmsg.NewShareAcknowledgeRequestTopicPartitionAcknowledgementBatch()
				b.FirstOffset, b.LastOffset, b.AcknowledgeTypes = rg[0], rg[1], []int8{2} // RELEASE
				ap.AcknowledgementBatches = append(ap.AcknowledgementBatches, b)
			}
			at.Partitions = append(at.Partitions, ap)
		}
		ack.Topics = append(ack.Topics, at)
	}
	if len(ack.Topics) > 0 {
		resp, err := ack.RequestWith(ctx, r.cl)
		if err != nil {
			return total, fmt.Errorf("repair release: %w", err)
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			return total, fmt.Errorf("repair release: %w", err)
		}
		for _, rt := range resp.Topics {
			for _, rp := range rt.Partitions {
				if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
					return total, fmt.Errorf("repair release %s/%d: %w", names[rt.TopicID], rp.Partition, err)
				}
			}
		}
	}
	return total, nil
}

func (r *repairer) setBrokerConfig(ctx context.Context, key, value string) error {
	op := kadm.SetConfig
	var v *string
	if value == "" {
		op = kadm.DeleteConfig
	} else {
		v = &value
	}
	resps, err := kadm.NewClient(r.cl).AlterBrokerConfigs(ctx, []kadm.AlterConfig{{Op: op, Name: key, Value: v}})
	if err == nil {
		for _, rr := range resps {
			if rr.Err != nil {
				err = rr.Err
			}
		}
	}
	if err != nil {
		return fmt.Errorf("set broker config %s=%q: %w", key, value, err)
	}
	return nil
}

// findOrphans reads every partition from its start, with control records,
// and returns the transactions that have records but no marker. On a data
// dir whose previous broker crashed, kfake has already aborted each of them
// in memory (it lost their state); abortOrphans writes the markers.
func findOrphans(ctx context.Context, cl *kgo.Client) ([]OrphanTxn, error) {
	adm := kadm.NewClient(cl)
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	names := topics.Names()
	if len(names) == 0 {
		return nil, nil
	}
	starts, err := adm.ListStartOffsets(ctx, names...)
	if err != nil {
		return nil, fmt.Errorf("list start offsets: %w", err)
	}
	ends, err := adm.ListEndOffsets(ctx, names...)
	if err != nil {
		return nil, fmt.Errorf("list end offsets: %w", err)
	}
	from := map[string]map[int32]kgo.Offset{}
	remaining := map[string]map[int32]int64{}
	starts.Each(func(lo kadm.ListedOffset) {
		e, ok := ends.Lookup(lo.Topic, lo.Partition)
		if lo.Err != nil || !ok || e.Err != nil || e.Offset <= lo.Offset {
			return
		}
		if from[lo.Topic] == nil {
			from[lo.Topic], remaining[lo.Topic] = map[int32]kgo.Offset{}, map[int32]int64{}
		}
		from[lo.Topic][lo.Partition] = kgo.NewOffset().At(lo.Offset)
		remaining[lo.Topic][lo.Partition] = e.Offset
	})
	if len(from) == 0 {
		return nil, nil
	}
	cons, err := kgo.NewClient(append(cl.Opts(),
		kgo.ConsumePartitions(from),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()),
		kgo.KeepControlRecords(),
	)...)
	if err != nil {
		return nil, err
	}
	defer cons.Close()

	type key struct {
		pid   int64
		epoch int16
	}
	open := map[string]map[int32]map[int64]*kgo.Record{} // first record of an open txn by pid
	for len(remaining) > 0 {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("scan for open transactions: %w", err)
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) { ferr = fmt.Errorf("scan %s/%d: %w", t, p, err) })
		if ferr != nil {
			return nil, ferr
		}
		fs.EachRecord(func(rec *kgo.Record) {
			if end, ok := remaining[rec.Topic][rec.Partition]; ok && rec.Offset+1 >= end {
				delete(remaining[rec.Topic], rec.Partition)
				if len(remaining[rec.Topic]) == 0 {
					delete(remaining, rec.Topic)
				}
			}
			if !rec.Attrs.IsTransactional() {
				return
			}
			ps := open[rec.Topic]
			if ps == nil {
				ps = map[int32]map[int64]*kgo.Record{}
				open[rec.Topic] = ps
			}
			if ps[rec.Partition] == nil {
				ps[rec.Partition] = map[int64]*kgo.Record{}
			}
			if rec.Attrs.IsControl() {
				delete(ps[rec.Partition], rec.ProducerID)
			} else if _, ok := ps[rec.Partition][rec.ProducerID]; !ok {
				ps[rec.Partition][rec.ProducerID] = rec
			}
		})
	}
	byTxn := map[key]*OrphanTxn{}
	var order []key
	for t, ps := range open {
		for p, pids := range ps {
			for pid, rec := range pids {
				k := key{pid, rec.ProducerEpoch}
				o := byTxn[k]
				if o == nil {
					o = &OrphanTxn{ProducerID: pid, Epoch: rec.ProducerEpoch, FirstOffsets: map[string]map[int32]int64{}, FirstRecord: rec.Timestamp}
					byTxn[k] = o
					order = append(order, k)
				}
				if o.FirstOffsets[t] == nil {
					o.FirstOffsets[t] = map[int32]int64{}
				}
				o.FirstOffsets[t][p] = rec.Offset
				if rec.Timestamp.Before(o.FirstRecord) {
					o.FirstRecord = rec.Timestamp
				}
			}
		}
	}
	slices.SortFunc(order, func(a, b key) int {
		if a.pid != b.pid {
			return int(min(max(a.pid-b.pid, -1), 1))
		}
		return int(a.epoch) - int(b.epoch)
	})
	out := make([]OrphanTxn, 0, len(order))
	for _, k := range order {
		out = append(out, *byTxn[k])
	}
	return out, nil
}

// LostStateCoordinatorEpoch is the coordinator epoch of the abort markers
// written for transactions whose state a crash lost. No Kafka coordinator
// writes a negative epoch, so a client can tell these aborts from any other
// (internal/kafkatxn's broker-lost-transaction recovery keys on it and
// defines the same value).
const LostStateCoordinatorEpoch int32 = -0x5745

// writeMarkers writes an abort (or commit) marker for each transaction on
// each of its partitions with WriteTxnMarkers, naming the lost state in the
// marker's coordinator epoch.
func writeMarkers(ctx context.Context, cl *kgo.Client, txns []OrphanTxn, commit bool) error {
	if len(txns) == 0 {
		return nil
	}
	req := kmsg.NewPtrWriteTxnMarkersRequest()
	for _, o := range txns {
		m := kmsg.NewWriteTxnMarkersRequestMarker()
		m.ProducerID, m.ProducerEpoch, m.Committed = o.ProducerID, o.Epoch, commit
		m.CoordinatorEpoch = LostStateCoordinatorEpoch
		for _, t := range slices.Sorted(maps.Keys(o.FirstOffsets)) {
			mt := kmsg.NewWriteTxnMarkersRequestMarkerTopic()
			mt.Topic = t
			mt.Partitions = slices.Sorted(maps.Keys(o.FirstOffsets[t]))
			m.Topics = append(m.Topics, mt)
		}
		req.Markers = append(req.Markers, m)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("write transaction markers: %w", err)
	}
	for _, m := range resp.Markers {
		for _, t := range m.Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					return fmt.Errorf("write transaction marker for producer %d on %s/%d: %w", m.ProducerID, t.Topic, p.Partition, err)
				}
			}
		}
	}
	return nil
}
