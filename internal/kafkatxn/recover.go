package kafkatxn

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
)

// What the embedded broker (kfake v0.0.0-20260918054303-01f206a7e32c, with
// franz-go v1.22.3) does, measured by TestKfakeTransactionFacts, and what
// Recover builds on:
//
//   - EndTxn (v5, KIP-890) bumps the producer epoch by one after every
//     commit or abort, so a handle must be read right before pre-commit.
//   - Repeating a raw EndTxn{Commit: true} with the handle's (id, epoch)
//     after it succeeded succeeds again, as long as the producer is still
//     at epoch+1 with no transaction open. Once the id began a new
//     transaction (or was re-initialised), the repeat answers
//     PRODUCER_FENCED: indistinguishable from a fence before the commit.
//     Hence the writer does not reuse an id while the latest completed
//     checkpoint may still name its committed transaction (slotCommitted).
//   - After the transaction timeout the broker aborts the transaction and
//     bumps the epoch; a commit with the handle then answers
//     INVALID_TXN_STATE. A commit of an aborted transaction also answers
//     INVALID_TXN_STATE. Both are data loss.
//   - ListTransactions lists every transactional id with state "Ongoing" or
//     "Empty"; the state filter works.
//   - InitProducerID on an id with an open transaction aborts it (the last
//     stable offset advances) and bumps the epoch; a raw EndTxn does not
//     fence a live producer.
//   - Open transactions and their records survive a broker restart on the
//     same kfake.DataDir, and can be committed afterwards.
//
// And what kgo v1.22.3 does: (*kgo.Client).EndTransaction(ctx, TryCommit)
// after a successful Flush occasionally (about 1 in 200-400 fresh clients
// under -race) decides that "no produce succeeded in this transaction",
// sends an ABORT instead and returns nil: a silent loss. The writer
// therefore ends transactions with raw EndTxn requests carrying the
// recorded handle (the request recovery uses, and whose answer tells a lost
// transaction apart), and only then lets kgo repeat the end to resynchronise
// its client (syncClient), replacing the client if that fails.

// Recover finishes what a previous attempt of this subtask left behind,
// before this writer initialises any producer (InitProducerID would abort
// open transactions of its id):
//
//  1. It commits each handle with a raw EndTxn request. Success, and
//     "already committed", are success. A transaction the broker timed out
//     or aborted (INVALID_TXN_STATE) is lost: Recover logs it at error
//     level and returns an error wrapping ErrTxnLost (a *LostTxnError per
//     handle) once it has done everything else; the caller fails the job
//     unless the user opted out, in which case the writer is usable. A
//     transaction whose id has moved on (PRODUCER_FENCED,
//     INVALID_PRODUCER_EPOCH) or expired (INVALID_PRODUCER_ID_MAPPING) ended
//     long before: it is logged and assumed committed (UnverifiedCommits),
//     not reported lost. Residual risk: if it had in fact been aborted (an
//     id shared with another application, or a job down longer than the
//     transaction timeout and then transactional.id.expiration.ms), that
//     loss goes unreported.
//     Except when the embedded broker lost the transaction in a crash
//     (every partition of the handle ends it with a lost-state abort
//     marker): then the subtask owning the id re-commits its records in a
//     new transaction (markers.go). Before judging EndTxn's answer it
//     reads the handle's partitions for that marker; if that read fails
//     (broker unreachable), Recover fails with ErrLostStateUnknown and
//     judges nothing: the job restarts and recovers again.
//  2. It aborts lingering transactions of this subtask's ids
//     ("<prefix>-<subtask>-*", and for subtask 0 also ids of subtasks >=
//     the current parallelism, left by a higher parallelism), found with
//     ListTransactions, by fencing each with InitProducerID. Lingering
//     transactions pin the last stable offset of every partition they
//     wrote to, stalling every read_committed reader.
//
// handles are the restored checkpoint's handles of this sink: pass every
// subtask's handles (the union), since subtask 0 may abort transactions of
// ids another subtask used; committing a handle twice is harmless. On a
// fresh start pass nil. Any other error (network, authorization) leaves the
// writer unrecovered; Recover may be called again.
//
// Without exactly-once Recover still commits the handles (the guarantee may
// have changed since the checkpoint) and aborts nothing if no prefix is set.
func (w *TxnWriter) Recover(ctx context.Context, handles []checkpoint.TxnHandle) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	if w.cfg.guarantee == ExactlyOnce && w.recovered {
		return errors.New("Recover called twice")
	}
	lost, err := w.commitHandles(ctx, handles)
	if err != nil {
		return err
	}
	if w.cfg.prefix != "" {
		if err := w.abortLingering(ctx); err != nil {
			return err
		}
	}
	// Keep the committed ids of the restored checkpoint out of the pool
	// until a later checkpoint completes, so that a second restore from the
	// same checkpoint can repeat their commits.
	var maxCkpt checkpoint.ID
	for _, h := range handles {
		maxCkpt = max(maxCkpt, h.Checkpoint)
	}
	for _, h := range handles {
		if sub, idx, ok := parseTransactionalID(w.cfg.prefix, h.TransactionalID); ok && sub == w.cfg.subtask && w.cfg.guarantee == ExactlyOnce {
			for idx >= len(w.slots) { // left by a larger pool: keep it reserved too
				w.addSlot()
			}
			s := w.slots[idx]
			s.state, s.handle, s.lastSnap = slotCommitted, h, maxCkpt
		}
	}
	// PreCommit keeps one id out of every snapshot; if the pool shrank since,
	// grow it past the reserved ids.
	for w.cfg.guarantee == ExactlyOnce && w.freeSlots() < 1 {
		w.addSlot()
	}
	w.lastPrecommit = max(w.lastPrecommit, maxCkpt)
	w.recovered = true
	return errors.Join(lost...)
}

// CommitRestored commits handles as Recover does (step 1), without touching
// any producer: the runtime calls it (RestoreCommitter) before any subtask
// of the job may fence or reuse transactional ids. A later Recover does not
// commit these handles again. It returns an error wrapping ErrTxnLost for
// lost transactions, as Recover does.
func (w *TxnWriter) CommitRestored(ctx context.Context, handles []checkpoint.TxnHandle) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	lost, err := w.commitHandles(ctx, handles)
	if err != nil {
		return err
	}
	return errors.Join(lost...)
}

// commitHandles commits each handle not committed yet by this writer; lost
// transactions are logged and returned in lost, any other error stops it.
func (w *TxnWriter) commitHandles(ctx context.Context, handles []checkpoint.TxnHandle) (lost []error, err error) {
	if w.restoreDone == nil {
		w.restoreDone = map[txnKey]bool{}
	}
	for _, h := range handles {
		if w.restoreDone[keyOf(h)] {
			continue
		}
		err := w.endTxn(ctx, h, true)
		var le *LostTxnError
		recommitted := false
		if errors.As(err, &le) {
			var rerr error
			if recommitted, rerr = w.recoverLostState(ctx, h, le); rerr != nil && !errors.Is(rerr, ErrTxnTopicGone) {
				// ErrRecommitIncomplete or ErrLostStateUnknown: the next
				// recovery redoes what is missing, or asks again.
				return nil, rerr
			} else if rerr != nil {
				err = rerr // lost for good: judged below
			}
		}
		switch {
		case errors.Is(err, ErrTxnTopicGone):
			// Before endedBefore: the answer it wraps says "ended before",
			// but the records are gone with their partition.
			w.lostTxns.Add(1)
			w.cfg.logger.Error("kafkatxn: pre-committed transaction of a completed checkpoint is LOST with its topic or partition; no recovery can bring its records back",
				zap.String("txn", h.TransactionalID), zap.Uint64("checkpoint", uint64(h.Checkpoint)), zap.Error(err))
			lost = append(lost, err)
		case recommitted:
			// The embedded broker lost it in a crash: re-committed (or
			// left to its owner subtask), see markers.go. Checked before
			// endedBefore: a re-commit interrupted by another crash has
			// bumped the id's epoch, so the next EndTxn answers
			// PRODUCER_FENCED although nothing was committed.
		case errors.As(err, &le) && endedBefore(le.Err):
			// The id moved on (a later transaction, a re-initialisation)
			// or expired: our transaction ended long before. Weir reuses
			// an id only after its commit and commits restored handles
			// before any producer of the job re-initialises an id, so it
			// was committed (as Flink assumes). The broker cannot say more.
			w.unverified.Add(1)
			w.cfg.logger.Warn("kafkatxn: restored transaction ended before and its id has moved on or expired; assuming it was committed",
				zap.String("txn", h.TransactionalID), zap.Int64("producer_id", h.ProducerID), zap.Int16("epoch", h.Epoch),
				zap.Uint64("checkpoint", uint64(h.Checkpoint)), zap.Error(le.Err))
		case errors.As(err, &le):
			w.lostTxns.Add(1)
			w.cfg.logger.Error("kafkatxn: pre-committed transaction of a completed checkpoint is LOST; its records are gone",
				zap.String("txn", h.TransactionalID), zap.Int64("producer_id", h.ProducerID), zap.Int16("epoch", h.Epoch),
				zap.Uint64("checkpoint", uint64(h.Checkpoint)), zap.Error(le.Err))
			lost = append(lost, err)
		case err != nil:
			return nil, err
		default:
			w.cfg.logger.Info("kafkatxn: recovered transaction committed",
				zap.String("txn", h.TransactionalID), zap.Uint64("checkpoint", uint64(h.Checkpoint)))
		}
		w.restoreDone[keyOf(h)] = true
	}
	return lost, nil
}

// txnKey identifies a handle's transaction (a handle holds a slice, so it
// is not comparable).
type txnKey struct {
	id         string
	pid        int64
	epoch      int16
	checkpoint checkpoint.ID
}

func keyOf(h checkpoint.TxnHandle) txnKey {
	return txnKey{h.TransactionalID, h.ProducerID, h.Epoch, h.Checkpoint}
}

// endedBefore reports whether a recovery commit's answer means the
// transaction ended earlier and its id has since moved to a newer epoch or
// producer id (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH) or expired
// (INVALID_PRODUCER_ID_MAPPING, after transactional.id.expiration.ms), as
// opposed to INVALID_TXN_STATE: the broker aborted it (timeout), a loss.
func endedBefore(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) ||
		errors.Is(err, kerr.InvalidProducerIDMapping)
}

// UnverifiedCommits counts restored transactions Recover and CommitRestored
// could not commit again because their id had moved on or expired, and
// assumed committed (see Recover).
func (w *TxnWriter) UnverifiedCommits() int64 { return w.unverified.Load() }

// recoverLostState runs the broker-lost-transaction recovery path
// (markers.go) for a handle EndTxn could not commit (le), and reports
// whether it re-committed the transaction (or earlier recoveries had). An
// error wraps ErrRecommitIncomplete (the broker lost the transaction and
// the copy is not complete yet) or ErrLostStateUnknown (the scan failed, so
// whether the broker lost it is unknown); the caller fails the recovery,
// never falls back to judging EndTxn's answer.
//
// Only the subtask that owns the handle's transactional id re-commits it
// (every subtask recovers the union of the handles, and two re-commits of
// one transaction would race and could both commit); the others leave it to
// the owner, which fails the job if it cannot.
func (w *TxnWriter) recoverLostState(ctx context.Context, h checkpoint.TxnHandle, le *LostTxnError) (bool, error) {
	if w.cfg.prefix == "" {
		return false, nil
	}
	if !w.owns(h.TransactionalID) {
		if _, _, ok := parseTransactionalID(w.cfg.prefix, h.TransactionalID); ok {
			w.cfg.logger.Debug("kafkatxn: transaction not committable here; its owner subtask recovers it",
				zap.String("txn", h.TransactionalID))
			return true, nil
		}
		return false, nil
	}
	if gone, err := w.missingPartition(ctx, h); err != nil {
		w.cfg.logger.Error("kafkatxn: cannot read the metadata of a restored transaction's topics; the recovery fails and must run again",
			zap.String("txn", h.TransactionalID), zap.Uint64("checkpoint", uint64(h.Checkpoint)), zap.Error(err))
		return false, fmt.Errorf("%w: %s of checkpoint %d: %w (EndTxn of the handle: %w)", ErrLostStateUnknown, h.TransactionalID, h.Checkpoint, err, le.Err)
	} else if gone != "" {
		// No later recovery can read or re-commit these records: report
		// the transaction lost (the caller fails the job) rather than
		// asking again on every restart.
		return false, &LostTxnError{Handle: h, Err: fmt.Errorf("%w: %s, written by transaction %s of checkpoint %d, whose commit the broker refused (%w)",
			ErrTxnTopicGone, gone, h.TransactionalID, h.Checkpoint, le.Err)}
	}
	n, err := w.recommitLost(ctx, h)
	switch {
	case errors.Is(err, errCommittedEverywhere):
		w.cfg.logger.Info("kafkatxn: restored transaction is committed on every partition (its commit markers are in the log)",
			zap.String("txn", h.TransactionalID), zap.Uint64("checkpoint", uint64(h.Checkpoint)))
		return true, nil
	case errors.Is(err, ErrRecommitIncomplete):
		w.cfg.logger.Error("kafkatxn: broker-lost-transaction recovery incomplete; the recovery fails and must run again",
			zap.String("txn", h.TransactionalID), zap.Uint64("checkpoint", uint64(h.Checkpoint)), zap.Error(err))
		return false, fmt.Errorf("%w (EndTxn of the handle: %w)", err, le.Err)
	case errors.Is(err, errNotLostState):
		w.cfg.logger.Info("kafkatxn: broker-lost-transaction recovery does not apply", zap.String("txn", h.TransactionalID), zap.Error(err))
		return false, nil
	case noReadAccess(err):
		// Only a cluster with ACLs refuses the read (the embedded broker
		// has none): the path cannot apply; judge EndTxn's answer as
		// before.
		w.cfg.logger.Warn("kafkatxn: broker-lost-transaction recovery cannot read the transaction's partitions (not authorized); judging the commit's answer",
			zap.String("txn", h.TransactionalID), zap.Error(err))
		return false, nil
	case err != nil:
		// The scan could not tell whether the broker lost the
		// transaction: judging EndTxn's answer now could assume committed
		// a transaction an interrupted re-commit left without copies.
		w.cfg.logger.Error("kafkatxn: broker-lost-transaction recovery could not scan the transaction; the recovery fails and must run again",
			zap.String("txn", h.TransactionalID), zap.Uint64("checkpoint", uint64(h.Checkpoint)), zap.Error(err))
		return false, fmt.Errorf("%w: %s of checkpoint %d: %w (EndTxn of the handle: %w)", ErrLostStateUnknown, h.TransactionalID, h.Checkpoint, err, le.Err)
	}
	w.cfg.logger.Warn("kafkatxn: the broker lost the state of a pre-committed transaction (embedded broker crash); "+
		"re-committed its records in a new transaction (broker-lost-transaction recovery path)",
		zap.String("txn", h.TransactionalID), zap.Int64("producer_id", h.ProducerID), zap.Int16("epoch", h.Epoch),
		zap.Uint64("checkpoint", uint64(h.Checkpoint)), zap.Int("records", n))
	return true, nil
}

// missingPartition returns a description of the first partition of h that
// no longer exists ("topic %q no longer exists", "partition N of topic %q
// no longer exists"), or "" if all exist. An error means the metadata could
// not be read: whether they exist is unknown.
func (w *TxnWriter) missingPartition(ctx context.Context, h checkpoint.TxnHandle) (string, error) {
	var topics []string
	for _, p := range h.Partitions {
		if !slices.Contains(topics, p.Topic) {
			topics = append(topics, p.Topic)
		}
	}
	if len(topics) == 0 {
		return "", nil
	}
	tds, err := kadm.NewClient(w.admin).ListTopics(ctx, topics...)
	if err != nil {
		return "", fmt.Errorf("metadata of %v: %w", topics, err)
	}
	for _, p := range h.Partitions {
		td, ok := tds[p.Topic]
		switch {
		case !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition) || errors.Is(td.Err, kerr.UnknownTopicID):
			return fmt.Sprintf("topic %q no longer exists", p.Topic), nil
		case td.Err != nil:
			return "", fmt.Errorf("metadata of %s: %w", p.Topic, td.Err)
		}
		if _, ok := td.Partitions[p.Partition]; !ok {
			return fmt.Sprintf("partition %d of topic %q no longer exists (the topic has %d partitions)", p.Partition, p.Topic, len(td.Partitions)), nil
		}
	}
	return "", nil
}

// noReadAccess reports whether err is the broker refusing a read for lack
// of authorization.
func noReadAccess(err error) bool {
	return errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed) ||
		errors.Is(err, kerr.TransactionalIDAuthorizationFailed)
}

// endTxn commits or aborts the transaction of h (EndTxn) on the writer's
// admin client.
func (w *TxnWriter) endTxn(ctx context.Context, h checkpoint.TxnHandle, commit bool) error {
	return EndTxn(ctx, w.admin, h, commit)
}

// EndTxn commits or aborts the transaction of h with a raw EndTxn request
// sent through cl (any client: it needs no producer of that transactional
// id, and it does not fence one). It retries while the broker answers
// CONCURRENT_TRANSACTIONS (a transition in progress). A commit the broker
// can no longer perform (the transaction timed out, was aborted or fenced,
// or its id expired) returns a *LostTxnError; the broker's error stays
// matchable with errors.Is either way.
//
// Weir commits this way even with a producer at hand: kgo v1.22.3's
// EndTransaction(TryCommit) has been seen to abort instead and return nil.
func EndTxn(ctx context.Context, cl *kgo.Client, h checkpoint.TxnHandle, commit bool) error {
	what := "commit"
	if !commit {
		what = "abort"
	}
	for backoff := 10 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		req := kmsg.NewPtrEndTxnRequest()
		req.TransactionalID = h.TransactionalID
		req.ProducerID = h.ProducerID
		req.ProducerEpoch = h.Epoch
		req.Commit = commit
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return fmt.Errorf("%s %s of checkpoint %d: %w", what, h.TransactionalID, h.Checkpoint, err)
		}
		err = kerr.ErrorForCode(resp.ErrorCode)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, kerr.ConcurrentTransactions):
			if err := sleep(ctx, backoff); err != nil {
				return fmt.Errorf("%s %s: %w", what, h.TransactionalID, err)
			}
		case commit && (errors.Is(err, kerr.InvalidTxnState) || errors.Is(err, kerr.ProducerFenced) ||
			errors.Is(err, kerr.InvalidProducerEpoch) || errors.Is(err, kerr.InvalidProducerIDMapping)):
			// The transaction was ended without us (timeout, abort, fence)
			// or its id expired: the broker can no longer commit it.
			return &LostTxnError{Handle: h, Err: err}
		default:
			return fmt.Errorf("%s %s of checkpoint %d: %w", what, h.TransactionalID, h.Checkpoint, err)
		}
	}
}

// abortLingering fences every ongoing transaction of the ids this subtask
// is responsible for.
func (w *TxnWriter) abortLingering(ctx context.Context) error {
	listed, err := kadm.NewClient(w.admin).ListTransactions(ctx, nil, []string{"Ongoing"})
	if err != nil {
		return fmt.Errorf("recover: list transactions: %w", err)
	}
	for _, t := range listed.Sorted() {
		if !w.owns(t.TxnID) || t.State != "Ongoing" {
			continue
		}
		if err := w.fence(ctx, t.TxnID); err != nil {
			return err
		}
		w.cfg.logger.Info("kafkatxn: aborted lingering transaction", zap.String("txn", t.TxnID), zap.Int64("producer_id", t.ProducerID))
	}
	return nil
}

// fence aborts the open transaction of txnID by initialising a producer id
// for it.
func (w *TxnWriter) fence(ctx context.Context, txnID string) error {
	for backoff := 10 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		req := kmsg.NewPtrInitProducerIDRequest()
		req.TransactionalID = &txnID
		req.TransactionTimeoutMillis = int32(w.cfg.txnTimeout.Milliseconds())
		req.ProducerID, req.ProducerEpoch = -1, -1
		resp, err := req.RequestWith(ctx, w.admin)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		switch {
		case err == nil:
			return nil
		case errors.Is(err, kerr.ConcurrentTransactions):
			// A real broker answers this while it aborts; ask again.
			if err := sleep(ctx, backoff); err != nil {
				return fmt.Errorf("recover: abort lingering %s: %w", txnID, err)
			}
		default:
			return fmt.Errorf("recover: abort lingering %s: %w", txnID, err)
		}
	}
}

// owns reports whether this subtask must abort lingering transactions of
// txnID: its own ids, and for subtask 0 the ids of subtasks beyond the
// current parallelism.
func (w *TxnWriter) owns(txnID string) bool {
	sub, _, ok := parseTransactionalID(w.cfg.prefix, txnID)
	return ok && (sub == w.cfg.subtask || (w.cfg.subtask == 0 && sub >= w.cfg.parallelism))
}

func (w *TxnWriter) addSlot() {
	i := len(w.slots)
	w.slots = append(w.slots, &slot{index: i, txnID: TransactionalID(w.cfg.prefix, w.cfg.subtask, i)})
}

func (w *TxnWriter) freeSlots() int {
	n := 0
	for _, s := range w.slots {
		if s.state == slotFree {
			n++
		}
	}
	return n
}

// parseTransactionalID splits "<prefix>-<subtask>-<index>". The numbers
// must be canonical decimals, so ids of a prefix that extends ours
// ("<prefix>-x-...") never match.
func parseTransactionalID(prefix, txnID string) (subtask, index int, ok bool) {
	rest, found := strings.CutPrefix(txnID, prefix+"-")
	if !found || prefix == "" {
		return 0, 0, false
	}
	a, b, found := strings.Cut(rest, "-")
	if !found {
		return 0, 0, false
	}
	subtask, err1 := strconv.Atoi(a)
	index, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil || subtask < 0 || index < 0 || strconv.Itoa(subtask) != a || strconv.Itoa(index) != b {
		return 0, 0, false
	}
	return subtask, index, true
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
