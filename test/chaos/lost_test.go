package chaos

import "testing"

// A job failed on a transaction the broker lost is told apart from any
// other failure by its status error: both forms kafkatxn gives
// ErrTxnLost (the second is the status of a job in a round of seed
// 2976612995), and nothing else.
func TestBrokerLostTransactionErrorsAreRecognised(t *testing.T) {
	tests := []struct {
		err  string
		lost bool
	}{
		{"runtime: job failed (not restarted): unrecoverable: task manager tm-a: task count#0: commit restored transactions of counts: " +
			"unrecoverable: kafkatxn: transaction weir-ba3e-counts-0-1 (producer 2967722029464949683, epoch 2) of checkpoint 7 lost: " +
			"INVALID_TXN_STATE: The producer attempted a transactional operation in an invalid state.", true},
		{"runtime: job failed (not restarted): unrecoverable: kafkatxn: pre-committed transaction lost: weir-x-0-1", true},
		{"task count#0 on tm-a: task manager lost", false},
		{"runtime: job failed (not restarted): unrecoverable: sharegroup: ErrReadUncommitted", false},
	}
	for _, tt := range tests {
		if got := lostTxn.MatchString(tt.err); got != tt.lost {
			t.Errorf("lostTxn.MatchString(%q) = %v, want %v", tt.err, got, tt.lost)
		}
	}
}
