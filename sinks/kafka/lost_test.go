package kafka

import (
	"errors"
	"fmt"
	"testing"

	"go.uber.org/zap"

	"github.com/weirstream/weir/internal/kafkatxn"
	"github.com/weirstream/weir/runtime"
)

// TestSinkFailsForGoodWhenARestoredTransactionsTopicIsGone: what Open and
// CommitRestored make of a recovery error. A lost transaction, e.g. one lost
// with its topic or partition (kafkatxn's test TestRecoverReportsALostTransactionWhoseTopic
// IsGoneAsLostForGood builds it against the broker) can never be recovered:
// the job must fail without restarting, with the cause, unless the user
// tolerates lost transactions. A recovery that could not ask the broker
// stays retryable.
func TestSinkFailsForGoodWhenARestoredTransactionsTopicIsGone(t *testing.T) {
	gone := &kafkatxn.LostTxnError{Err: fmt.Errorf("%w: topic %q no longer exists", kafkatxn.ErrTxnTopicGone, "out")}
	aborted := &kafkatxn.LostTxnError{Err: errors.New("INVALID_TXN_STATE")} // the broker aborted it (timeout)
	unknown := fmt.Errorf("%w: broker unreachable", kafkatxn.ErrLostStateUnknown)
	cases := []struct {
		name          string
		err           error
		tolerate      bool
		wantNil       bool
		unrecoverable bool
	}{
		{"topic gone", gone, false, false, true},
		{"topic gone, losses tolerated", gone, true, true, false},
		{"aborted by the broker", aborted, false, false, true},
		{"aborted by the broker, losses tolerated", aborted, true, true, false},
		{"scan failed, retried", unknown, false, false, false},
		{"scan failed, losses tolerated, retried", unknown, true, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := &Sink[int]{sc: sinkCfg{tolerateLoss: tc.tolerate}, log: zap.NewNop()}
			err := s.tolerate(tc.err)
			if (err == nil) != tc.wantNil {
				t.Fatalf("tolerate(%v) = %v", tc.err, err)
			}
			if err == nil {
				return
			}
			if runtime.IsUnrecoverable(err) != tc.unrecoverable || !errors.Is(err, tc.err) {
				t.Fatalf("tolerate(%v) = %v: unrecoverable %v, want %v, and the cause kept", tc.err, err, runtime.IsUnrecoverable(err), tc.unrecoverable)
			}
		})
	}
}
