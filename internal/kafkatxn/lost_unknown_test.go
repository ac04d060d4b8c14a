package kafkatxn

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/weirstream/weir/checkpoint"
)

// TestRecoverFailsRetryablyWhenItCannotScanALostTransaction: the broker lost
// a pre-committed transaction (its partitions end it with lost-state abort
// markers, as the embedded broker's repair writes them) and an interrupted
// re-commit moved the id's epoch on, so EndTxn answers PRODUCER_FENCED,
// which alone reads as "ended before, assume committed". When the scan of
// the transaction's partitions fails (the broker does not answer
// ListOffsets), recovery must fail with ErrLostStateUnknown (not ErrTxnLost,
// nothing assumed committed), and the next recovery, with the broker
// answering, must re-commit every record.
func TestRecoverFailsRetryablyWhenItCannotScanALostTransaction(t *testing.T) {
	ctx := testCtx(t)
	c := newCluster(t)
	addrs := c.ListenAddrs()
	w1, h := precommitted(t, addrs, rec(0, "a"), rec(1, "b"), rec(0, "c"))
	w1.crash()

	lostAndFenced(t, ctx, addrs, h)

	// The broker does not answer the scan's ListOffsets.
	var refuse atomic.Bool
	refuse.Store(true)
	c.ControlKey(kmsg.ListOffsets.Int16(), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !refuse.Load() {
			return nil, nil, false
		}
		lreq := kr.(*kmsg.ListOffsetsRequest)
		resp := lreq.ResponseKind().(*kmsg.ListOffsetsResponse)
		for _, rt := range lreq.Topics {
			st := kmsg.NewListOffsetsResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewListOffsetsResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.UnknownServerError.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})

	w := newWriter(t, ctx, addrs)
	err := w.Recover(ctx, []checkpoint.TxnHandle{h})
	unverified := w.UnverifiedCommits()
	w.Close()
	if !errors.Is(err, ErrLostStateUnknown) || errors.Is(err, ErrTxnLost) || errors.Is(err, ErrRecommitIncomplete) {
		t.Fatalf("Recover with the scan failing = %v, want an error wrapping ErrLostStateUnknown only", err)
	}
	if unverified != 0 {
		t.Fatalf("Recover assumed %d transactions committed although it could not scan them", unverified)
	}
	if got := readCommitted(t, ctx, addrs); !equalParts(got, [testPartitions][]string{}) {
		t.Fatalf("records visible after a failed recovery:%s", fmtParts(got))
	}

	refuse.Store(false)
	w = newWriter(t, ctx, addrs)
	defer w.Close()
	if err := w.Recover(ctx, []checkpoint.TxnHandle{h}); err != nil {
		t.Fatalf("Recover with the broker answering: %v", err)
	}
	if got, want := readCommitted(t, ctx, addrs), [testPartitions][]string{{"a", "c"}, {"b"}}; !equalParts(got, want) {
		t.Fatalf("after the recovery, read committed:%s\nwant:%s", fmtParts(got), fmtParts(want))
	}
}

// lostAndFenced gives h's transaction the state the embedded broker leaves
// after a crash lost it and an interrupted re-commit moved its id on:
// lost-state abort markers on every partition of the handle, then two
// re-initialisations of the id (a repair's fence and an interrupted copy's
// client), so that EndTxn answers PRODUCER_FENCED.
func lostAndFenced(t *testing.T, ctx context.Context, addrs []string, h checkpoint.TxnHandle) {
	t.Helper()
	adm := newClient(t, addrs)
	req := kmsg.NewPtrWriteTxnMarkersRequest()
	m := kmsg.NewWriteTxnMarkersRequestMarker()
	m.ProducerID, m.ProducerEpoch, m.CoordinatorEpoch = h.ProducerID, h.Epoch, LostStateCoordinatorEpoch
	mt := kmsg.NewWriteTxnMarkersRequestMarkerTopic()
	mt.Topic = testTopic
	for _, p := range h.Partitions {
		mt.Partitions = append(mt.Partitions, p.Partition)
	}
	m.Topics = append(m.Topics, mt)
	req.Markers = append(req.Markers, m)
	if _, err := req.RequestWith(ctx, adm); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		init := kmsg.NewPtrInitProducerIDRequest()
		init.TransactionalID = &h.TransactionalID
		init.TransactionTimeoutMillis = 60000
		init.ProducerID, init.ProducerEpoch = -1, -1
		resp, err := init.RequestWith(ctx, adm)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := EndTxn(ctx, adm, h, true); !errors.Is(err, kerr.ProducerFenced) {
		t.Fatalf("EndTxn of the lost transaction = %v, want PRODUCER_FENCED (the case judged \"assumed committed\")", err)
	}
}

// TestRecoverReportsALostTransactionWhoseTopicIsGoneAsLostForGood: the
// broker lost a pre-committed transaction (as in the test above) and its
// topic was then deleted, or recreated without one of the transaction's
// partitions. No recovery can ever read or re-commit those records: every
// Recover must report the transaction lost (ErrTxnLost) with the cause
// (ErrTxnTopicGone, naming the topic and partition), never
// ErrLostStateUnknown, which restarts the job to ask again, forever.
func TestRecoverReportsALostTransactionWhoseTopicIsGoneAsLostForGood(t *testing.T) {
	cases := []struct {
		name string
		gone func(ctx context.Context, adm *kadm.Client) error
		want string // in the error
	}{
		{"topic deleted", func(ctx context.Context, adm *kadm.Client) error {
			_, err := adm.DeleteTopic(ctx, testTopic)
			return err
		}, `topic "out" no longer exists`},
		{"topic recreated without the partition", func(ctx context.Context, adm *kadm.Client) error {
			if _, err := adm.DeleteTopic(ctx, testTopic); err != nil {
				return err
			}
			_, err := adm.CreateTopic(ctx, 1, 1, nil, testTopic)
			return err
		}, `partition 1 of topic "out" no longer exists`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			c := newCluster(t)
			addrs := c.ListenAddrs()
			w1, h := precommitted(t, addrs, rec(0, "a"), rec(1, "b"), rec(0, "c"))
			w1.crash()
			lostAndFenced(t, ctx, addrs, h)
			if err := tc.gone(ctx, kadm.NewClient(newClient(t, addrs))); err != nil {
				t.Fatal(err)
			}
			for attempt := 1; attempt <= 2; attempt++ { // the same answer on every restart
				w := newWriter(t, ctx, addrs)
				err := w.Recover(ctx, []checkpoint.TxnHandle{h})
				unverified, lost := w.UnverifiedCommits(), w.LostTransactions()
				w.Close()
				if !errors.Is(err, ErrTxnTopicGone) || !errors.Is(err, ErrTxnLost) || errors.Is(err, ErrLostStateUnknown) {
					t.Fatalf("attempt %d: Recover = %v, want an error wrapping ErrTxnTopicGone and ErrTxnLost, not ErrLostStateUnknown", attempt, err)
				}
				if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), h.TransactionalID) {
					t.Fatalf("attempt %d: Recover = %v, want it to name the transaction and say %q", attempt, err, tc.want)
				}
				if unverified != 0 || lost != 1 {
					t.Fatalf("attempt %d: %d assumed committed, %d lost; want 0 and 1", attempt, unverified, lost)
				}
			}
		})
	}
}
