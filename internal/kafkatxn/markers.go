package kafkatxn

import (
	"context"
	"errors"
	"fmt"
	"strconv"

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
// of the same transactional id, each copy carrying HeaderRecommittedFrom.
// Readers see the records once, in a later position of the same partitions;
// a second recovery from the same checkpoint finds the committed copies and
// does nothing.
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
// broker-lost-transaction recovery path: "<producer id>/<epoch>" of the
// transaction they were copied from.
const HeaderRecommittedFrom = "weir.recommitted-from"

// errCommittedEverywhere means the transaction ends with a commit marker on
// every partition of its handle: committed, whatever EndTxn says now.
var errCommittedEverywhere = errors.New("committed on every partition")

// errNotLostState means the transaction did not end with a lost-state abort
// marker: it was aborted (or timed out) by a broker that knew it.
var errNotLostState = errors.New("not lost by the broker")

// recommitLost re-commits the transaction of h if the broker lost its
// state. It returns the number of records re-committed (0 if a previous
// recovery already did), or an error wrapping errNotLostState if the path
// does not apply.
func (w *TxnWriter) recommitLost(ctx context.Context, h checkpoint.TxnHandle) (int, error) {
	if len(h.Partitions) == 0 {
		return 0, fmt.Errorf("%w: the handle records no partitions", errNotLostState)
	}
	tag := strconv.FormatInt(h.ProducerID, 10) + "/" + strconv.Itoa(int(h.Epoch))
	var copies []*kgo.Record
	for _, p := range h.Partitions { // partitions the commit reached before a crash need nothing
		recs, done, err := w.scanLost(ctx, h, p, tag)
		if err != nil {
			return 0, err
		}
		if done {
			w.cfg.logger.Info("kafkatxn: broker-lost transaction already re-committed by an earlier recovery",
				zap.String("txn", h.TransactionalID), zap.String("from", tag), zap.Uint64("checkpoint", uint64(h.Checkpoint)))
			return 0, nil
		}
		copies = append(copies, recs...)
	}
	if len(copies) == 0 {
		return 0, errCommittedEverywhere
	}
	opts := append(append([]kgo.Opt(nil), w.cfg.clientOpts...),
		kgo.DisableClientMetrics(),
		kgo.SeedBrokers(w.cfg.brokers...),
		kgo.TransactionalID(h.TransactionalID),
		kgo.TransactionTimeout(w.cfg.txnTimeout),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return 0, fmt.Errorf("kafkatxn: re-commit %s: %w", h.TransactionalID, err)
	}
	defer cl.Close()
	if err := cl.BeginTransaction(); err != nil {
		return 0, fmt.Errorf("kafkatxn: re-commit %s: begin: %w", h.TransactionalID, err)
	}
	for i, r := range copies {
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			return 0, fmt.Errorf("kafkatxn: re-commit %s: produce to %s/%d: %w", h.TransactionalID, r.Topic, r.Partition, err)
		}
		if w.cfg.recommitHook != nil {
			w.cfg.recommitHook(i + 1)
		}
	}
	pid, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		return 0, fmt.Errorf("kafkatxn: re-commit %s: producer id: %w", h.TransactionalID, err)
	}
	nh := checkpoint.TxnHandle{TransactionalID: h.TransactionalID, ProducerID: pid, Epoch: epoch, Checkpoint: h.Checkpoint}
	if err := EndTxn(ctx, w.admin, nh, true); err != nil {
		return 0, fmt.Errorf("kafkatxn: re-commit %s: %w", h.TransactionalID, err)
	}
	_ = cl.EndTransaction(ctx, kgo.TryCommit) // resynchronise the client; the broker answers a retry
	return len(copies), nil
}

// scanLost reads partition p from the handle's first offset to its end. It
// returns copies of the transaction's records if the transaction ends there
// with a lost-state abort marker, or done if committed copies tagged tag
// follow it.
func (w *TxnWriter) scanLost(ctx context.Context, h checkpoint.TxnHandle, p checkpoint.TxnPartition, tag string) (copies []*kgo.Record, done bool, err error) {
	ends, err := kadm.NewClient(w.admin).ListEndOffsets(ctx, p.Topic)
	if err != nil {
		return nil, false, fmt.Errorf("kafkatxn: re-commit %s: end offsets of %s: %w", h.TransactionalID, p.Topic, err)
	}
	end, ok := ends.Lookup(p.Topic, p.Partition)
	if !ok || end.Err != nil {
		return nil, false, fmt.Errorf("kafkatxn: re-commit %s: end offset of %s/%d: %v", h.TransactionalID, p.Topic, p.Partition, end.Err)
	}
	if end.Offset <= p.FirstOffset {
		return nil, false, fmt.Errorf("%w: %s/%d ends at %d, before the transaction's first offset %d", errNotLostState, p.Topic, p.Partition, end.Offset, p.FirstOffset)
	}
	opts := append(append([]kgo.Opt(nil), w.cfg.clientOpts...),
		kgo.DisableClientMetrics(),
		kgo.SeedBrokers(w.cfg.brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{p.Topic: {p.Partition: kgo.NewOffset().At(p.FirstOffset)}}),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()),
		kgo.KeepControlRecords(),
	)
	cons, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, false, err
	}
	defer cons.Close()

	var (
		marked    bool               // our transaction's lost-state abort marker seen
		committed bool               // our transaction's commit marker seen
		tagged    = map[int64]bool{} // producers with tagged copies after it
		pos       = p.FirstOffset
		endedErr  error
	)
	for pos < end.Offset && endedErr == nil && !done && !committed {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, false, fmt.Errorf("kafkatxn: re-commit %s: read %s/%d: %w", h.TransactionalID, p.Topic, p.Partition, err)
		}
		for _, fe := range fs.Errors() {
			return nil, false, fmt.Errorf("kafkatxn: re-commit %s: read %s/%d: %w", h.TransactionalID, p.Topic, p.Partition, fe.Err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset < pos || endedErr != nil || done || committed {
				return
			}
			pos = r.Offset + 1
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
					committed = true
				case coordEpoch != LostStateCoordinatorEpoch:
					endedErr = fmt.Errorf("%w: aborted by its coordinator (epoch %d) on %s/%d", errNotLostState, coordEpoch, p.Topic, p.Partition)
				default:
					marked = true
				}
			case !marked && r.ProducerID == h.ProducerID && r.ProducerEpoch == h.Epoch:
				c := &kgo.Record{Topic: r.Topic, Partition: r.Partition, Key: r.Key, Value: r.Value,
					Timestamp: r.Timestamp, Headers: append(append([]kgo.RecordHeader(nil), r.Headers...),
						kgo.RecordHeader{Key: HeaderRecommittedFrom, Value: []byte(tag)})}
				copies = append(copies, c)
			case marked && !control:
				for _, hd := range r.Headers {
					if hd.Key == HeaderRecommittedFrom && string(hd.Value) == tag {
						tagged[r.ProducerID] = true
					}
				}
			case marked && control && tagged[r.ProducerID]:
				if commit, _, err := decodeMarker(r); err == nil && commit {
					done = true
				}
				delete(tagged, r.ProducerID)
			}
		})
	}
	if endedErr != nil {
		return nil, false, endedErr
	}
	if committed {
		return nil, false, nil
	}
	if !marked {
		return nil, false, fmt.Errorf("%w: no marker for producer %d on %s/%d", errNotLostState, h.ProducerID, p.Topic, p.Partition)
	}
	return copies, done, nil
}

// decodeMarker decodes a control record: commit or abort, and the
// coordinator epoch.
func decodeMarker(r *kgo.Record) (commit bool, coordinatorEpoch int32, err error) {
	var k kmsg.ControlRecordKey
	if err := k.ReadFrom(r.Key); err != nil {
		return false, 0, fmt.Errorf("kafkatxn: control record at %s/%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
	}
	var v kmsg.EndTxnMarker
	if err := v.ReadFrom(r.Value); err != nil {
		return false, 0, fmt.Errorf("kafkatxn: control record at %s/%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
	}
	return k.Type == kmsg.ControlRecordKeyTypeCommit, v.CoordinatorEpoch, nil
}
