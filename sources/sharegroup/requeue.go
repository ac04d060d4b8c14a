package sharegroup

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/kafkatxn"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// HeaderRequeues is the header counting how often the transactional source
// re-queued a record (see requeue).
const HeaderRequeues = "weir.requeues"

// The delivery budget. The broker counts a delivery at every acquisition,
// whatever ended it: a restart, a rollback, a lapsed lock or group churn
// costs one as a processing failure does, and past
// group.share.delivery.count.limit the broker archives the record. A
// failed attempt costs one delivery of each record it acquired, and the
// source sees it: when a subtask closes, every lane of its attempt in this
// process stops fetching before any releases (so none acquires what
// another releases), and a batch acquired but never admitted is judged at
// Close (settle). So the transactional source does not wait for the last
// delivery: a record acquired with at most restartBurn deliveries left
// (count >= limit - restartBurn, at least 2: under Kafka's limit of 5, the
// third) that no committed marker covers is not processed but re-queued,
// by admit or, for a batch never admitted, at Close: copied to the group's
// retry topic (which the source also reads) in a transaction of its own,
// committed at once, that also carries an ack marker covering the
// original; then the original is ACCEPTed. The copy starts with a fresh
// budget. If the process dies after the commit and before the ACCEPT, the
// original comes back and the lookup finds the committed marker: it is
// ACCEPTed, not processed. A record is poison when decoding it fails (the
// source's own observation), or, with MaxRequeues > 0, when it was
// re-queued that often (HeaderRequeues); poison records go to the
// dead-letter topic inside the epoch's transaction.
// (docs/architecture.md, "Delivery budget".)

// restartBurn is how many deliveries of one record may pass before the
// source can re-queue it: the one a failed attempt costs, and a margin of
// one the source never sees (an attempt killed before it judged its batch
// leaves it to the lock's expiry; a stray fetch at Close, see inFlight; a
// subtask of the same source in another process, which the siblings of
// this one do not stop).
const restartBurn = 2

// requeuePrefixSuffix makes the re-queue writer's transactional-id prefix
// from the source's. No source's prefix ends with it (a configured one is
// refused, a default one gets a '_' appended), so the re-queue ids of job
// "a" are never the marker ids of another job: a job whose prefix was
// "a-rq" fenced and aborted job "a"'s re-queue transactions, and each took
// the other's markers for its own (issue 38).
const requeuePrefixSuffix = "-rq"

// requeueWriter is the transactional writer of re-queue transactions, with
// its own transactional ids ("<prefix>-rq-<subtask>-<index>") and a
// counter standing in for checkpoint ids.
type requeueWriter struct {
	w *kafkatxn.TxnWriter
	n checkpoint.ID
	// beforeCommit, tests only (set before Open): runs with the handle of a
	// re-queue transaction that passed its conflict check, before its
	// commit.
	beforeCommit func(checkpoint.TxnHandle)
}

// requeueRepairWait bounds how long a re-queue whose commit failed waits
// for the broker to come back and its transaction to be recovered.
const requeueRepairWait = time.Minute

// repairRequeue finishes the re-queue transaction h whose commit failed
// (cerr) with the recovery a restored checkpoint's transaction gets
// (kafkatxn's CommitRestored: commit again, and if the embedded broker lost
// the transaction in a crash, re-commit exactly the partitions its commit
// did not reach), retrying until the broker answers. A re-queue transaction
// is in no checkpoint: once this attempt fails, nothing knows its handle,
// and a commit torn by a crash of the broker in the middle of EndTxn (kfake
// writes the markers partition by partition) would stay torn: a committed
// copy without its marker is processed next to its original (a duplicate),
// a committed marker without its copy makes the original count as done (a
// loss). It returns nil once the transaction is committed on every
// partition; an error (the transaction was aborted for good, so the
// originals come back and are judged again; or the recovery did not finish
// in requeueRepairWait) fails the attempt.
func (s *Source[T]) repairRequeue(ctx context.Context, l *lane, h checkpoint.TxnHandle, cerr error) error {
	s.log.Warn("the re-queue transaction's commit failed; recovering it", zap.String("lane", l.name),
		zap.String("txn", h.TransactionalID), zap.Error(cerr))
	ctx, cancel := context.WithTimeout(ctx, requeueRepairWait)
	defer cancel()
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 2*time.Second) {
		err := s.rq.w.CommitRestored(ctx, []checkpoint.TxnHandle{h})
		switch {
		case err == nil:
			s.log.Warn("re-queue transaction recovered after its commit failed: committed on every partition",
				zap.String("lane", l.name), zap.String("txn", h.TransactionalID))
			return nil
		case errors.Is(err, kafkatxn.ErrTxnLost):
			// Aborted by a broker that knew it (timeout, a stale-marker
			// abort): on every partition, so the originals come back.
			return fmt.Errorf("commit the re-queue transaction: %w (its recovery: %w)", cerr, err)
		}
		s.log.Debug("re-queue transaction not recovered yet; retrying", zap.String("txn", h.TransactionalID), zap.Error(err))
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("commit the re-queue transaction: %w (its recovery did not finish in %v: %w)", cerr, requeueRepairWait, err)
		case <-t.C:
		}
	}
}

// requeues returns a record's re-queue count.
func requeues(r *kgo.Record) int {
	for _, h := range r.Headers {
		if h.Key == HeaderRequeues {
			if n, err := strconv.Atoi(string(h.Value)); err == nil && n >= 0 {
				return n
			}
		}
	}
	return 0
}

// requeueRecord copies r for the retry topic with its re-queue count raised.
func requeueRecord(r *kgo.Record, topic string) *kgo.Record {
	hs := make([]kgo.RecordHeader, 0, len(r.Headers)+1)
	for _, h := range r.Headers {
		if h.Key != HeaderRequeues {
			hs = append(hs, h)
		}
	}
	hs = append(hs, kgo.RecordHeader{Key: HeaderRequeues, Value: []byte(strconv.Itoa(requeues(r) + 1))})
	return &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Headers: hs}
}

// requeue re-queues recs, which lane l holds, and ACCEPTs them. On a
// conflict (an earlier marker overlapping them appeared since they were
// looked up: someone else processed or is processing them) the transaction
// is aborted and the records are returned to be set aside behind that
// marker, as any record covered by another transaction's marker is.
func (s *Source[T]) requeue(ctx context.Context, l *lane, recs []*kgo.Record) ([]asideRec, error) {
	rq := &s.rq
	rq.n++
	id := rq.n
	cur, err := rq.w.Current(ctx)
	if err != nil {
		return nil, fmt.Errorf("re-queue transaction: %w", err)
	}
	offsets := map[acklog.TopicPartition][]int64{}
	for _, r := range recs {
		if err := rq.w.Write(ctx, requeueRecord(r, s.cfg.requeueTopic)); err != nil {
			return nil, fmt.Errorf("re-queue: %w", err)
		}
		tp := acklog.TopicPartition{Topic: r.Topic, Partition: r.Partition}
		offsets[tp] = append(offsets[tp], r.Offset)
	}
	m := acklog.Marker{Group: s.cfg.group, Member: s.member + "/requeue", TransactionalID: cur.TransactionalID,
		ProducerID: cur.ProducerID, Ranges: acklog.RangesOf(offsets), CreatedAt: time.Now()}
	rec := m.Record(s.cfg.ackLogTopic)
	if err := rq.w.Write(ctx, rec); err != nil {
		return nil, fmt.Errorf("re-queue marker: %w", err)
	}
	if err := rq.w.Flush(ctx); err != nil {
		return nil, fmt.Errorf("re-queue: %w", err)
	}
	if err := s.ix.CatchUp(ctx, rec.Offset+1); err != nil {
		return nil, fmt.Errorf("ack-log: %w", err)
	}
	h, _, err := rq.w.PreCommit(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("re-queue: %w", err)
	}
	own := acklog.Entry{Marker: m, Offset: rec.Offset, Status: acklog.Open, ProducerEpoch: rec.ProducerEpoch}
	if cs := s.ix.Conflicts(own); len(cs) > 0 {
		s.log.Info("re-queue aborted: an earlier ack marker covers the records now; they wait for it",
			zap.String("lane", l.name), zap.Int64("marker", cs[0].Offset))
		if err := rq.w.Abort(ctx, id); err != nil {
			return nil, fmt.Errorf("abort the re-queue transaction: %w", err)
		}
		aside := make([]asideRec, 0, len(recs))
		for _, r := range recs {
			e, ok := s.ix.Lookup(acklog.TopicPartition{Topic: r.Topic, Partition: r.Partition}, r.Offset)
			if !ok || e.Offset < 0 {
				e = cs[0] // judged by the conflicting marker
			}
			aside = append(aside, asideRec{r: r, marker: e})
		}
		return aside, nil
	}
	if rq.beforeCommit != nil {
		rq.beforeCommit(h)
	}
	if err := rq.w.Commit(ctx, id); err != nil {
		if err := s.repairRequeue(ctx, l, h, err); err != nil {
			return nil, err
		}
	}
	s.log.Info("re-queued records at their last healthy delivery to the retry topic", zap.String("lane", l.name),
		zap.Int("records", len(recs)), zap.String("retry_topic", s.cfg.requeueTopic))
	// Committed: the marker covers the originals whatever happens next.
	if err := l.acceptNow(ctx, recs); err != nil {
		s.log.Warn("accepting re-queued records failed; they come back and the ack-log recognises them",
			zap.String("lane", l.name), zap.Error(err))
	}
	return nil, nil
}
