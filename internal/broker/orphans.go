package broker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

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

// findOrphans reads every partition from its start, with control records,
// and returns the transactions that have records but no marker. On a data
// dir whose previous broker crashed, kfake has already aborted each of them
// in memory (it lost their state); writeMarkers writes the markers. It also
// returns, per producer id, the highest epoch of the lost-state abort
// markers earlier repairs wrote (fenceOrphans checks they are still
// fenced).
func findOrphans(ctx context.Context, cl *kgo.Client) ([]OrphanTxn, map[int64]int16, error) {
	adm := kadm.NewClient(cl)
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("list topics: %w", err)
	}
	names := topics.Names()
	if len(names) == 0 {
		return nil, nil, nil
	}
	starts, err := adm.ListStartOffsets(ctx, names...)
	if err != nil {
		return nil, nil, fmt.Errorf("list start offsets: %w", err)
	}
	ends, err := adm.ListEndOffsets(ctx, names...)
	if err != nil {
		return nil, nil, fmt.Errorf("list end offsets: %w", err)
	}
	from := map[string]map[int32]kgo.Offset{}
	remaining := map[string]map[int32]int64{} // end offset of each partition not read to it yet
	next := map[string]map[int32]int64{}      // offset after the last record read of each partition
	starts.Each(func(lo kadm.ListedOffset) {
		e, ok := ends.Lookup(lo.Topic, lo.Partition)
		if lo.Err != nil || !ok || e.Err != nil || e.Offset <= lo.Offset {
			return
		}
		if from[lo.Topic] == nil {
			from[lo.Topic], remaining[lo.Topic], next[lo.Topic] = map[int32]kgo.Offset{}, map[int32]int64{}, map[int32]int64{}
		}
		from[lo.Topic][lo.Partition] = kgo.NewOffset().At(lo.Offset)
		remaining[lo.Topic][lo.Partition] = e.Offset
		next[lo.Topic][lo.Partition] = lo.Offset
	})
	ids := map[string][16]byte{}
	for _, d := range topics {
		ids[d.Topic] = d.ID
	}
	if len(from) == 0 {
		return nil, nil, nil
	}
	cons, err := kgo.NewClient(append(cl.Opts(),
		kgo.ConsumePartitions(from),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()),
		kgo.KeepControlRecords(),
	)...)
	if err != nil {
		return nil, nil, err
	}
	defer cons.Close()

	type key struct {
		pid   int64
		epoch int16
	}
	open := map[string]map[int32]map[int64]*kgo.Record{} // first record of an open txn by pid
	lost := map[int64]int16{}                            // highest epoch of a lost-state abort marker by pid
	for len(remaining) > 0 {
		// A compacted topic may have lost the records just below its end
		// offset, so a partition can be read to its end before a record at
		// end-1 came. A poll that yields nothing for scanIdle asks the
		// broker which partitions hold nothing from their next offset on
		// (readToEnd): those are done. Never the wait alone: a loaded
		// broker may take longer than scanIdle to answer a fetch, and
		// a scan that stopped there missed every open transaction.
		pctx, cancel := context.WithTimeout(ctx, scanIdle)
		fs := cons.PollFetches(pctx)
		idle := pctx.Err() != nil && fs.NumRecords() == 0
		cancel()
		if err := ctx.Err(); err != nil {
			return nil, nil, fmt.Errorf("scan for open transactions: %w", err)
		}
		if idle {
			done, err := readToEnd(ctx, cl, ids, next, remaining)
			if err != nil {
				return nil, nil, fmt.Errorf("scan for open transactions: %w", err)
			}
			for t, ps := range done {
				for p := range ps {
					delete(remaining[t], p)
				}
				if len(remaining[t]) == 0 {
					delete(remaining, t)
				}
			}
			continue
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				ferr = fmt.Errorf("scan %s/%d: %w", t, p, err)
			}
		})
		if ferr != nil {
			return nil, nil, ferr
		}
		fs.EachRecord(func(rec *kgo.Record) {
			next[rec.Topic][rec.Partition] = max(next[rec.Topic][rec.Partition], rec.Offset+1)
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
				if lostStateAbort(rec) {
					if e, ok := lost[rec.ProducerID]; !ok || rec.ProducerEpoch > e {
						lost[rec.ProducerID] = rec.ProducerEpoch
					}
				}
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
	return out, lost, nil
}

// lostStateAbort reports whether control record r is an abort marker with
// LostStateCoordinatorEpoch.
func lostStateAbort(r *kgo.Record) bool {
	var k kmsg.ControlRecordKey
	var v kmsg.EndTxnMarker
	return k.ReadFrom(r.Key) == nil && v.ReadFrom(r.Value) == nil &&
		k.Type == kmsg.ControlRecordKeyTypeAbort && v.CoordinatorEpoch == LostStateCoordinatorEpoch
}

// LostStateCoordinatorEpoch is the coordinator epoch of the abort markers
// written for transactions whose state a crash lost. No Kafka coordinator
// writes a negative epoch, so a client can tell these aborts from any other
// (internal/kafkatxn's broker-lost-transaction recovery keys on it and
// defines the same value).
const LostStateCoordinatorEpoch int32 = -0x5745

// fenceOrphans fences, durably, every producer that kfake's own crash
// handling left able to continue a transaction a crash lost, and returns
// their transactional ids. lost are the epochs of earlier repairs'
// lost-state abort markers by producer id (findOrphans).
//
// At load kfake aborts each transaction a crash left open in memory and
// bumps its producer's epoch by one, in memory only: pids.log keeps the old
// epoch until the producer's next InitProducerID or EndTxn. So the fence
// of a lost transaction does not survive the next crash if that comes
// first: the restarted broker is back at the lost transaction's epoch and
// accepts its producer, which goes on producing into the transaction the
// crash lost and commits its tail without its head (the head stays
// aborted). It also fails when the producer was already one epoch ahead of
// pids.log (an EndTxn retried after an earlier crash answers with the
// unpersisted epoch): the bump then lands on the lost transaction's epoch.
//
// So every producer whose epoch is not above that of a transaction lost in
// a crash (this one's orphans, earlier ones' lost-state markers) is
// re-initialised (InitProducerID naming the producer id and its current
// epoch, KIP-360) until it is, which writes the epoch to pids.log, as a
// Kafka coordinator durably fences a producer whose transaction it
// aborted. The fence ends one epoch above the lost transaction's, where
// kfake's own bump puts it, so EndTxn answers a commit of the lost
// transaction as kfake does after a single crash (INVALID_TXN_STATE).
//
// Run it before the markers are written: a crash in between leaves the
// orphans without markers, so the next start checks them again.
func fenceOrphans(ctx context.Context, cl *kgo.Client, txns []OrphanTxn, lost map[int64]int16) ([]string, error) {
	need := maps.Clone(lost) // producer id -> the epoch its current one must be above
	if need == nil {
		need = map[int64]int16{}
	}
	for _, o := range txns {
		if e, ok := need[o.ProducerID]; !ok || o.Epoch > e {
			need[o.ProducerID] = o.Epoch
		}
	}
	if len(need) == 0 {
		return nil, nil
	}
	adm := kadm.NewClient(cl)
	listed, err := adm.ListTransactions(ctx, slices.Sorted(maps.Keys(need)), nil)
	if err != nil {
		return nil, fmt.Errorf("list transactions of lost transactions' producers: %w", err)
	}
	if len(listed) == 0 {
		return nil, nil // ids expired: no client can use these producer ids
	}
	described, err := adm.DescribeTransactions(ctx, listed.TransactionalIDs()...)
	if err != nil {
		return nil, fmt.Errorf("describe transactions of lost transactions' producers: %w", err)
	}
	var fenced []string
	for _, d := range described.Sorted() {
		if d.Err != nil {
			return nil, fmt.Errorf("describe transaction %s: %w", d.TxnID, d.Err)
		}
		above, ok := need[d.ProducerID]
		if !ok || d.ProducerEpoch > above {
			continue // fenced: kfake's bump, or a later use of the id
		}
		pid, epoch := d.ProducerID, d.ProducerEpoch
		for pid == d.ProducerID && epoch <= above {
			req := kmsg.NewPtrInitProducerIDRequest()
			req.TransactionalID = &d.TxnID
			req.TransactionTimeoutMillis = d.TimeoutMillis
			req.ProducerID, req.ProducerEpoch = pid, epoch
			resp, err := req.RequestWith(ctx, cl)
			if err == nil {
				err = kerr.ErrorForCode(resp.ErrorCode)
			}
			if err != nil {
				return nil, fmt.Errorf("fence producer %d (transactional id %s, epoch %d): %w", pid, d.TxnID, epoch, err)
			}
			pid, epoch = resp.ProducerID, resp.ProducerEpoch
		}
		fenced = append(fenced, d.TxnID)
	}
	return fenced, nil
}

// scanIdle is how long findOrphans polls without getting a record before
// it asks the broker which partitions it has read to their end
// (readToEnd).
const scanIdle = 2 * time.Second

// readToEnd asks the broker, with one fetch at next of every partition in
// remaining, which of them hold no record at or after next (a compacted
// partition whose last records below its end offset are gone), and
// returns those. ids are the topics' ids (Fetch names topics by id from
// version 13).
func readToEnd(ctx context.Context, cl *kgo.Client, ids map[string][16]byte, next, remaining map[string]map[int32]int64) (map[string]map[int32]bool, error) {
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxBytes = 1 << 20
	req.SessionEpoch = -1 // a full fetch, no fetch session
	byID := map[[16]byte]string{}
	for _, t := range slices.Sorted(maps.Keys(remaining)) {
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic, rt.TopicID = t, ids[t]
		byID[ids[t]] = t
		for _, p := range slices.Sorted(maps.Keys(remaining[t])) {
			rp := kmsg.NewFetchRequestTopicPartition()
			rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = p, next[t][p], 1<<10
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("fetch: %w", err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, fmt.Errorf("fetch: %w", err)
	}
	done := map[string]map[int32]bool{}
	for _, rt := range resp.Topics {
		t := rt.Topic
		if t == "" {
			t = byID[rt.TopicID]
		}
		for _, rp := range rt.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				return nil, fmt.Errorf("fetch %s/%d: %w", t, rp.Partition, err)
			}
			if _, ok := remaining[t][rp.Partition]; !ok || holdsFrom(rp.RecordBatches, next[t][rp.Partition]) {
				continue
			}
			if done[t] == nil {
				done[t] = map[int32]bool{}
			}
			done[t][rp.Partition] = true
		}
	}
	return done, nil
}

// holdsFrom reports whether the record batches of a fetch answer (whole,
// or cut after a batch header) hold an offset at or after off. A batch
// begins with its first offset (8 bytes), its length (4), the partition
// leader epoch (4), the magic byte, the CRC (4), the attributes (2) and
// its last offset delta (4).
func holdsFrom(batches []byte, off int64) bool {
	const header = 27
	for len(batches) >= header {
		first := int64(binary.BigEndian.Uint64(batches))
		length := int64(binary.BigEndian.Uint32(batches[8:]))
		last := first + int64(int32(binary.BigEndian.Uint32(batches[23:])))
		if last >= off {
			return true
		}
		if int64(len(batches)) < 12+length {
			break
		}
		batches = batches[12+length:]
	}
	return false
}

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
