package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// declineOnce declines the at-th snapshot of subtask 0 over the whole test
// (all attempts), and keeps its progress: the job carries on.
type declineOnce struct {
	Source[seqRec]
	snaps    *atomic.Int64
	at       int64
	declined *atomic.Bool
	sub      int
}

func (d *declineOnce) Open(ctx context.Context, oc *OperatorContext) error {
	d.sub = oc.Subtask
	return d.Source.Open(ctx, oc)
}

func (d *declineOnce) Snapshot(ctx context.Context, id checkpoint.ID) (OperatorState, error) {
	if d.sub == 0 && d.snaps.Add(1) == d.at && d.declined.CompareAndSwap(false, true) {
		return OperatorState{}, fmt.Errorf("%w: test declines checkpoint %d", checkpoint.ErrDeclined, id)
	}
	return d.Source.Snapshot(ctx, id)
}

// abortingSink follows the protocol's step 7 literally: it aborts what it
// pre-committed for a checkpoint when that checkpoint is aborted. It does
// not carry aborted work (not a checkpoint.AbortCarrier).
type abortingSink struct {
	s *txnSink
}

func (a abortingSink) Open(ctx context.Context, oc *OperatorContext) error { return a.s.Open(ctx, oc) }
func (a abortingSink) Write(ctx context.Context, v seqRec) error           { return a.s.Write(ctx, v) }
func (a abortingSink) Snapshot(ctx context.Context, id checkpoint.ID) (OperatorState, error) {
	return a.s.Snapshot(ctx, id)
}
func (a abortingSink) Close() error { return a.s.Close() }
func (a abortingSink) NotifyCheckpointComplete(ctx context.Context, id checkpoint.ID) error {
	return a.s.NotifyCheckpointComplete(ctx, id)
}
func (a abortingSink) NotifyCheckpointAborted(_ context.Context, id checkpoint.ID) error {
	var keep []checkpoint.TxnHandle
	for _, h := range a.s.pending {
		if h.Checkpoint == id {
			a.s.txns.abort(h.TransactionalID)
			continue
		}
		keep = append(keep, h)
	}
	a.s.pending = keep
	return nil
}

// A declined checkpoint must not lose its epoch's records, whether the sink
// carries the aborted transaction to the next checkpoint (then the job
// tolerates the decline) or aborts it on NotifyCheckpointAborted (then the
// job rolls back to its last completed checkpoint). The coordinator dies
// right after persisting the checkpoint that follows the decline, so the
// restore, not a notification, must commit the carried transaction.
func TestDeclinedCheckpointFollowedByACrashLosesNothing(t *testing.T) {
	const keys, n = 10, 150
	for _, tc := range []struct {
		name    string
		newSink func(*memTxns) Sink[seqRec]
	}{
		{"sink carries aborted work", func(m *memTxns) Sink[seqRec] { return &txnSink{txns: m} }},
		{"sink aborts on NotifyCheckpointAborted", func(m *memTxns) Sink[seqRec] { return abortingSink{&txnSink{txns: m}} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			viol, txns := &violations{}, newMemTxns()
			var snaps atomic.Int64
			var declined, crashed atomic.Bool
			src := func() Source[seqRec] {
				return &declineOnce{Source: seqSourceOf(seqSource{keys: keys, splits: 2, n: n, perPoll: 1, pollDelay: time.Millisecond})(),
					snaps: &snaps, at: 3, declined: &declined}
			}
			fp := &hookFailpoints{fn: func(name string) error {
				if name == "jm.after-checkpoint-persisted" && declined.Load() && crashed.CompareAndSwap(false, true) {
					return errors.New("coordinator crash after the checkpoint that follows the decline")
				}
				return nil
			}}
			res, err := NewMiniCluster(CheckpointInterval(5*time.Millisecond), Failpoints(fp), Restarts(3, time.Millisecond)).
				Run(t.Context(), seqJobTo(src, viol, func() Sink[seqRec] { return tc.newSink(txns) }, 1, 2))
			if err != nil {
				t.Fatal(err)
			}
			if !declined.Load() || !crashed.Load() {
				t.Fatalf("declined %v, crashed %v: the scenario did not happen", declined.Load(), crashed.Load())
			}
			if v := viol.get(); len(v) > 0 {
				t.Fatalf("keyed state: %s", v[0])
			}
			checkSequences(t, txns.output(), keys, n)
			t.Logf("restarts %d", res.Restarts)
		})
	}
}

// Asking for tolerated checkpoint failures in a job whose listeners may
// discard an aborted checkpoint's work is refused at start.
func TestToleranceIsRefusedForListenersThatDiscardAbortedWork(t *testing.T) {
	txns := newMemTxns()
	src := seqSourceOf(seqSource{keys: 2, splits: 1, n: 10, perPoll: 1})
	res, err := NewMiniCluster(CheckpointInterval(5*time.Millisecond), TolerableCheckpointFailures(2)).
		Run(t.Context(), seqJobTo(src, &violations{}, func() Sink[seqRec] { return abortingSink{&txnSink{txns: txns}} }, 1, 1))
	if !errors.Is(err, ErrInvalidOption) || res.Restarts != 0 || len(txns.output()) != 0 {
		t.Fatalf("err = %v, %d restarts, %d records: want ErrInvalidOption at start", err, res.Restarts, len(txns.output()))
	}
}
