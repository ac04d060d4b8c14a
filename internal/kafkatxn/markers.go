package kafkatxn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
)

// The broker-lost-transaction recovery path.
//
// Apache Kafka keeps transaction state in __transaction_state, so a
// pre-committed transaction survives any broker crash and Recover's EndTxn
// commits it. Weir's embedded broker (kfake) keeps it only across a clean
// stop: after a crash it treats every transaction without a marker as
// aborted (in memory, bumping the producer epoch), and Weir's broker wrapper
// writes an abort marker for each, with LostStateCoordinatorEpoch as the
// coordinator epoch so that clients can tell "the broker lost this
// transaction" from "this transaction was aborted". EndTxn with the handle
// then answers INVALID_TXN_STATE.
//
// Committing such a transaction in place with a WriteTxnMarkers commit does
// not work on kfake (measured): its in-memory abort stays, read_committed
// clients keep skipping the transaction's records and every later
// transaction of its producer id, and the next crash replay shows the
// records as committed. So this path re-commits the transaction instead: it
// reads the transaction's records (read_uncommitted, from the first offsets
// the handle records per partition) and writes copies in a new transaction
// of the same transactional id, each copy carrying HeaderRecommittedFrom
// with the original's offset. Readers see the records once, in a later
// position of the same partitions.
//
// The copy is complete only when every record of the lost transaction has a
// committed copy: a broker crash in the middle of the copy aborts the
// copies produced so far, and must fail the copy. (Before the embedded
// broker fenced lost transactions' producers durably, kfake accepted the
// interrupted client at its old epoch after a repair and a second crash,
// and the rest of the copy committed without its head.) So each recovery copies, per partition, exactly the records without a
// committed copy (none if earlier recoveries copied them all), a
// partition's copies in one flush, and after the commit reads every
// partition read_committed: a record without a visible copy fails the
// recovery with ErrRecommitIncomplete, and the next recovery copies what is
// still missing. No record gets two committed copies.
//
// It never runs against a broker that knows the transaction: only after
// EndTxn answered that the transaction can no longer be committed, and only
// if, on every partition of the handle, the transaction ends with an abort
// marker carrying LostStateCoordinatorEpoch, which no Kafka coordinator
// writes (coordinator epochs are never negative).

// LostStateCoordinatorEpoch is the coordinator epoch of the abort markers the
// embedded broker writes for transactions whose state a crash lost
// (internal/broker uses the same value).
const LostStateCoordinatorEpoch int32 = -0x5745

// HeaderRecommittedFrom is the header on records re-committed by the
// broker-lost-transaction recovery path: "<producer id>/<epoch>/<offset>",
// the transaction they were copied from and the original record's offset
// (on the same partition). Copies by earlier versions carry
// "<producer id>/<epoch>" only; recovery matches them to originals by
// content.
const HeaderRecommittedFrom = "weir.recommitted-from"

// errCommittedEverywhere means the transaction ends with a commit marker on
// every partition of its handle: committed, whatever EndTxn says now.
var errCommittedEverywhere = errors.New("committed on every partition")

// errNotLostState means the transaction did not end with a lost-state abort
// marker: it was aborted (or timed out) by a broker that knew it.
var errNotLostState = errors.New("not lost by the broker")

// ErrRecommitIncomplete is wrapped by Recover and CommitRestored errors when
// the broker-lost-transaction recovery path found a transaction the
// embedded broker lost but could not make a committed copy of each of its
// records visible: the copy failed (the broker crashed in the middle of it,
// or a request failed), or its read_committed verification after the
// commit found copies missing. Nothing is reported lost: the job restarts
// and the next recovery copies exactly the records that still have no
// committed copy.
var ErrRecommitIncomplete = errors.New("broker-lost transaction not completely re-committed")

// ErrLostStateUnknown is wrapped by Recover and CommitRestored errors when
// EndTxn could no longer commit a restored transaction and the
// broker-lost-transaction recovery path could not read the transaction's
// partitions to tell whether the broker lost it (the broker unreachable, a
// request failed). EndTxn's answer is not judged then: after a lost state
// and an interrupted re-commit it can say PRODUCER_FENCED ("ended before,
// assume committed") of a transaction whose records have no committed copy.
// Nothing is reported lost or assumed committed: the job restarts and the
// next recovery asks again. Against Apache Kafka this only turns a failed
// read into a retry.
var ErrLostStateUnknown = errors.New("cannot tell whether the broker lost a restored transaction")

// ErrTxnTopicGone is wrapped, next to ErrTxnLost, by Recover and
// CommitRestored errors when a restored transaction the broker could no
// longer commit wrote to a topic that no longer exists, or to a partition
// its topic no longer has (the topic was deleted, or recreated with fewer
// partitions): no recovery can read or re-commit those records, so asking
// again (ErrLostStateUnknown) would only restart the job forever. Connectors
// fail the job for good with it.
var ErrTxnTopicGone = errors.New("a restored transaction's topic or partition no longer exists")

// recommitVerifyWait bounds the read_committed verification of one
// partition after a re-commit: a transaction of another producer that is
// open before the copies pins the last stable offset below them, and the
// copies cannot be seen read_committed until it ends.
const recommitVerifyWait = 30 * time.Second

// recommitLost re-commits the transaction of h if the broker lost its
// state. It returns the number of records copied (0 if earlier recoveries
// already committed a copy of each), an error wrapping errNotLostState if
// the path does not apply, or one wrapping ErrRecommitIncomplete if it
// applies and did not complete.
//
// Per partition of the handle it copies exactly the records that have no
// committed copy yet, in their original order, all of a partition's copies
// produced in one flush (one batch while they fit ProducerBatchMaxBytes),
// in one new transaction of a fresh client; after the commit it checks
// read_committed that every record of the lost transaction has a visible
// copy.
func (w *TxnWriter) recommitLost(ctx context.Context, h checkpoint.TxnHandle) (int, error) {
	if len(h.Partitions) == 0 {
		return 0, fmt.Errorf("%w: the handle records no partitions", errNotLostState)
	}
	tag := strconv.FormatInt(h.ProducerID, 10) + "/" + strconv.Itoa(int(h.Epoch))
	var (
		parts   []*lostPartition
		batches [][]*kgo.Record
		lost    bool // a partition ends the transaction with a lost-state abort marker
	)
	for _, p := range h.Partitions { // partitions the commit reached before a crash need nothing
		lp, err := w.scanLost(ctx, h, p, tag)
		if err != nil {
			if lost && !errors.Is(err, errNotLostState) {
				// The broker lost the transaction (a lost-state marker
				// proves it): never fall back to "ended before".
				err = fmt.Errorf("%w: %w", ErrRecommitIncomplete, err)
			}
			return 0, err
		}
		if lp.committed {
			continue
		}
		lost = true
		parts = append(parts, lp)
		if m := lp.missing(tag); len(m) > 0 {
			if len(m) < len(lp.originals) {
				w.cfg.logger.Warn("kafkatxn: broker-lost transaction partly re-committed by an earlier recovery; copying the records without a committed copy",
					zap.String("txn", h.TransactionalID), zap.String("from", tag), zap.String("topic", p.Topic),
					zap.Int32("partition", p.Partition), zap.Int("missing", len(m)), zap.Int("records", len(lp.originals)))
			}
			batches = append(batches, m)
		}
	}
	if !lost {
		return 0, errCommittedEverywhere
	}
	if len(batches) == 0 {
		w.cfg.logger.Info("kafkatxn: broker-lost transaction already re-committed by an earlier recovery (a committed copy of every record)",
			zap.String("txn", h.TransactionalID), zap.String("from", tag), zap.Uint64("checkpoint", uint64(h.Checkpoint)))
		return 0, nil
	}
	n, err := w.copyMissing(ctx, h, batches)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %w", ErrRecommitIncomplete, h.TransactionalID, err)
	}
	if err := w.verifyCopies(ctx, h, tag, parts); err != nil {
		return 0, err
	}
	return n, nil
}

// copyMissing produces batches (each the missing copies of one partition)
// in one new transaction of h's transactional id, on a fresh client, one
// flush per partition, and commits it with a raw EndTxn. It returns the
// number of records copied.
func (w *TxnWriter) copyMissing(ctx context.Context, h checkpoint.TxnHandle, batches [][]*kgo.Record) (int, error) {
	largest := 1
	for _, b := range batches {
		largest = max(largest, len(b))
	}
	opts := append(append([]kgo.Opt(nil), w.cfg.clientOpts...),
		kgo.DisableClientMetrics(),
		kgo.SeedBrokers(w.cfg.brokers...),
		kgo.TransactionalID(h.TransactionalID),
		kgo.TransactionTimeout(w.cfg.txnTimeout),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ManualFlushing(), // a partition's copies leave together, at Flush
		kgo.MaxBufferedRecords(largest),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return 0, fmt.Errorf("re-commit client: %w", err)
	}
	defer cl.Close()
	if err := cl.BeginTransaction(); err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	n := 0
	for i, b := range batches {
		if err := produceFlushed(ctx, cl, b); err != nil {
			return 0, fmt.Errorf("produce to %s/%d: %w", b[0].Topic, b[0].Partition, err)
		}
		n += len(b)
		if w.cfg.recommitHook != nil {
			w.cfg.recommitHook(i + 1)
		}
	}
	pid, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		return 0, fmt.Errorf("producer id: %w", err)
	}
	nh := checkpoint.TxnHandle{TransactionalID: h.TransactionalID, ProducerID: pid, Epoch: epoch, Checkpoint: h.Checkpoint}
	if err := EndTxn(ctx, w.admin, nh, true); err != nil {
		var le *LostTxnError
		if errors.As(err, &le) { // the copy's transaction, not the handle's: not ErrTxnLost
			err = le.Err
		}
		return 0, fmt.Errorf("commit the copy (producer %d, epoch %d): %w", pid, epoch, err)
	}
	_ = cl.EndTransaction(ctx, kgo.TryCommit) // resynchronise the client; the broker answers a retry
	return n, nil
}

// produceFlushed buffers recs on cl (a ManualFlushing client with room for
// them) and flushes them, returning the first error.
func produceFlushed(ctx context.Context, cl *kgo.Client, recs []*kgo.Record) error {
	var (
		mu    sync.Mutex
		first error
	)
	for _, r := range recs {
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			mu.Lock()
			defer mu.Unlock()
			if first == nil {
				first = err
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	return first
}

// verifyCopies reads each partition of parts read_committed after a
// re-commit and returns an error wrapping ErrRecommitIncomplete unless every
// original record has a visible copy tagged tag.
func (w *TxnWriter) verifyCopies(ctx context.Context, h checkpoint.TxnHandle, tag string, parts []*lostPartition) error {
	for _, lp := range parts {
		if len(lp.originals) == 0 {
			continue
		}
		lp.resetCopies()
		vctx, cancel := context.WithTimeout(ctx, recommitVerifyWait)
		end, err := w.endOffset(vctx, h, lp.p)
		if err == nil {
			err = w.readPartition(vctx, h, lp.p, end, kgo.ReadCommitted(), func(r *kgo.Record) bool {
				if !r.Attrs.IsControl() {
					lp.count(r, tag)
				}
				return lp.have < len(lp.originals)
			})
		}
		cancel()
		if err != nil {
			return fmt.Errorf("%w: %s: verify %s/%d read_committed (%d of %d copies seen): %w",
				ErrRecommitIncomplete, h.TransactionalID, lp.p.Topic, lp.p.Partition, lp.have, len(lp.originals), err)
		}
		if lp.have < len(lp.originals) {
			return fmt.Errorf("%w: %s: after its commit, %d of the %d records of %s/%d have no copy visible read_committed",
				ErrRecommitIncomplete, h.TransactionalID, len(lp.originals)-lp.have, len(lp.originals), lp.p.Topic, lp.p.Partition)
		}
	}
	return nil
}

// lostPartition is what scanLost found on one partition of a handle: the
// lost transaction's records, and which of them have a committed copy.
type lostPartition struct {
	p         checkpoint.TxnPartition
	committed bool          // the transaction's own commit marker is here: nothing to copy
	originals []*kgo.Record // the transaction's records, in offset order
	at        map[int64]int // original offset -> index in originals
	copies    []int         // committed copies per original
	have      int           // originals with at least one committed copy
	legacy    int           // where matching the next legacy copy starts
}

// resetCopies forgets the copies counted, indexing originals.
func (lp *lostPartition) resetCopies() {
	lp.at = make(map[int64]int, len(lp.originals))
	for i, r := range lp.originals {
		lp.at[r.Offset] = i
	}
	lp.copies = make([]int, len(lp.originals))
	lp.have, lp.legacy = 0, 0
}

// count records r as a committed copy if it is a copy of one of the
// originals, identified by the original offset in its HeaderRecommittedFrom
// value, "<tag>/<offset>". A copy by an earlier version of this path
// carries only "<tag>": it counts for the first original without a copy
// that it equals (key, value, headers), originals taken in order.
func (lp *lostPartition) count(r *kgo.Record, tag string) {
	v, ok := recommittedFrom(r)
	if !ok {
		return
	}
	i := -1
	switch rest, found := strings.CutPrefix(v, tag+"/"); {
	case found:
		off, err := strconv.ParseInt(rest, 10, 64)
		if j, known := lp.at[off]; err == nil && known {
			i = j
		}
	case v == tag:
		i = lp.matchLegacy(r)
	}
	if i < 0 {
		return
	}
	if lp.copies[i] == 0 {
		lp.have++
	}
	lp.copies[i]++
}

// matchLegacy returns the index of the first original without a copy that
// has r's content, searching from where the previous match was (legacy
// copies were written in the originals' order), or -1.
func (lp *lostPartition) matchLegacy(r *kgo.Record) int {
	n := len(lp.originals)
	for k := range n {
		i := (lp.legacy + k) % n
		if lp.copies[i] == 0 && sameContent(lp.originals[i], r) {
			lp.legacy = i + 1
			return i
		}
	}
	return -1
}

// sameContent reports whether copy c has the key, value and headers of
// original o (c's HeaderRecommittedFrom aside).
func sameContent(o, c *kgo.Record) bool {
	hs := slices.DeleteFunc(slices.Clone(c.Headers), func(hd kgo.RecordHeader) bool { return hd.Key == HeaderRecommittedFrom })
	return bytes.Equal(o.Key, c.Key) && bytes.Equal(o.Value, c.Value) &&
		slices.EqualFunc(o.Headers, hs, func(a, b kgo.RecordHeader) bool { return a.Key == b.Key && bytes.Equal(a.Value, b.Value) })
}

// recommittedFrom returns the value of r's HeaderRecommittedFrom header.
func recommittedFrom(r *kgo.Record) (string, bool) {
	for _, hd := range r.Headers {
		if hd.Key == HeaderRecommittedFrom {
			return string(hd.Value), true
		}
	}
	return "", false
}

// missing returns copies, ready to produce, of the originals without a
// committed copy, in their original order, each tagged "<tag>/<offset>".
func (lp *lostPartition) missing(tag string) []*kgo.Record {
	var out []*kgo.Record
	for i, r := range lp.originals {
		if lp.copies[i] > 0 {
			continue
		}
		out = append(out, &kgo.Record{Topic: r.Topic, Partition: r.Partition, Key: r.Key, Value: r.Value,
			Timestamp: r.Timestamp, Headers: append(append([]kgo.RecordHeader(nil), r.Headers...),
				kgo.RecordHeader{Key: HeaderRecommittedFrom, Value: []byte(tag + "/" + strconv.FormatInt(r.Offset, 10))})})
	}
	return out
}

// scanLost reads partition p from the handle's first offset to its end
// (read_uncommitted, markers included). If the transaction ends there with
// a lost-state abort marker, it returns the transaction's records and, for
// each, the copies tagged tag after the marker whose transactions ended
// with a commit marker. If the transaction's own commit marker is there, it
// returns committed.
func (w *TxnWriter) scanLost(ctx context.Context, h checkpoint.TxnHandle, p checkpoint.TxnPartition, tag string) (*lostPartition, error) {
	end, err := w.endOffset(ctx, h, p)
	if err != nil {
		return nil, err
	}
	if end <= p.FirstOffset {
		return nil, fmt.Errorf("%w: %s/%d ends at %d, before the transaction's first offset %d", errNotLostState, p.Topic, p.Partition, end, p.FirstOffset)
	}
	var (
		lp       = &lostPartition{p: p}
		marked   bool                        // our transaction's lost-state abort marker seen
		pending  = map[int64][]*kgo.Record{} // per producer id: tagged copies awaiting their transaction's marker
		endedErr error
	)
	err = w.readPartition(ctx, h, p, end, kgo.ReadUncommitted(), func(r *kgo.Record) bool {
		control := r.Attrs.IsControl()
		switch {
		case !marked && r.ProducerID == h.ProducerID && control:
			commit, coordEpoch, err := decodeMarker(r)
			switch {
			case err != nil:
				endedErr = err
			case commit:
				// A crash in the middle of EndTxn: the commit marker
				// reached this partition, not all of them. Nothing to
				// copy here.
				lp.committed = true
			case coordEpoch != LostStateCoordinatorEpoch:
				endedErr = fmt.Errorf("%w: aborted by its coordinator (epoch %d) on %s/%d", errNotLostState, coordEpoch, p.Topic, p.Partition)
			default:
				marked = true
				lp.resetCopies()
				return true
			}
			return false
		case !marked && r.ProducerID == h.ProducerID && r.ProducerEpoch == h.Epoch:
			lp.originals = append(lp.originals, r)
		case marked && !control:
			if _, ok := recommittedFrom(r); ok {
				pending[r.ProducerID] = append(pending[r.ProducerID], r)
			}
		case marked && control:
			// A producer's transactions follow one another: its next
			// marker ends the transaction of its pending copies.
			if copies, ok := pending[r.ProducerID]; ok {
				if commit, _, err := decodeMarker(r); err == nil && commit {
					for _, c := range copies {
						lp.count(c, tag)
					}
				}
				delete(pending, r.ProducerID)
			}
		}
		return true
	})
	switch {
	case err != nil:
		return nil, err
	case endedErr != nil:
		return nil, endedErr
	case lp.committed:
		return lp, nil
	case !marked:
		return nil, fmt.Errorf("%w: no marker for producer %d on %s/%d", errNotLostState, h.ProducerID, p.Topic, p.Partition)
	}
	return lp, nil
}

// endOffset returns the end offset (high watermark) of partition p.
func (w *TxnWriter) endOffset(ctx context.Context, h checkpoint.TxnHandle, p checkpoint.TxnPartition) (int64, error) {
	ends, err := kadm.NewClient(w.admin).ListEndOffsets(ctx, p.Topic)
	if err != nil {
		return 0, fmt.Errorf("re-commit %s: end offsets of %s: %w", h.TransactionalID, p.Topic, err)
	}
	end, ok := ends.Lookup(p.Topic, p.Partition)
	if !ok {
		return 0, fmt.Errorf("re-commit %s: no end offset of %s/%d", h.TransactionalID, p.Topic, p.Partition)
	}
	if end.Err != nil {
		return 0, fmt.Errorf("re-commit %s: end offset of %s/%d: %w", h.TransactionalID, p.Topic, p.Partition, end.Err)
	}
	return end.Offset, nil
}

// readPartition reads partition p from the handle's first offset up to end
// at isolation level, control records included, calling each on every
// record in offset order until each returns false.
func (w *TxnWriter) readPartition(ctx context.Context, h checkpoint.TxnHandle, p checkpoint.TxnPartition, end int64, level kgo.IsolationLevel, each func(*kgo.Record) bool) error {
	opts := append(append([]kgo.Opt(nil), w.cfg.clientOpts...),
		kgo.DisableClientMetrics(),
		kgo.SeedBrokers(w.cfg.brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{p.Topic: {p.Partition: kgo.NewOffset().At(p.FirstOffset)}}),
		kgo.FetchIsolationLevel(level),
		kgo.KeepControlRecords(),
	)
	cons, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("re-commit %s: read %s/%d: %w", h.TransactionalID, p.Topic, p.Partition, err)
	}
	defer cons.Close()
	pos, more := p.FirstOffset, true
	for pos < end && more {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("re-commit %s: read %s/%d at %d of %d: %w", h.TransactionalID, p.Topic, p.Partition, pos, end, err)
		}
		for _, fe := range fs.Errors() {
			return fmt.Errorf("re-commit %s: read %s/%d: %w", h.TransactionalID, p.Topic, p.Partition, fe.Err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset < pos || !more {
				return
			}
			pos = r.Offset + 1
			more = each(r)
		})
	}
	return nil
}

// decodeMarker decodes a control record: commit or abort, and the
// coordinator epoch.
func decodeMarker(r *kgo.Record) (commit bool, coordinatorEpoch int32, err error) {
	var k kmsg.ControlRecordKey
	if err := k.ReadFrom(r.Key); err != nil {
		return false, 0, fmt.Errorf("control record at %s/%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
	}
	var v kmsg.EndTxnMarker
	if err := v.ReadFrom(r.Value); err != nil {
		return false, 0, fmt.Errorf("control record at %s/%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
	}
	return k.Type == kmsg.ControlRecordKeyTypeCommit, v.CoordinatorEpoch, nil
}
