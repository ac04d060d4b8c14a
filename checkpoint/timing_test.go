package checkpoint

import (
	"errors"
	"testing"
	"time"
)

func TestMaxTransactionLifetimeCoversEpochTimeoutsToleratedFailuresAndRestart(t *testing.T) {
	for _, tc := range []struct {
		name string
		t    Timing
		want time.Duration
	}{
		{"one checkpoint and a restart", Timing{Interval: time.Second, Timeout: time.Minute, RestartBudget: 10 * time.Second}, 71 * time.Second},
		{"three tolerated failures", Timing{Interval: time.Second, Timeout: time.Minute, TolerableFailures: 3, RestartBudget: time.Minute}, 4*61*time.Second + time.Minute},
		{"min pause longer than the interval", Timing{Interval: time.Second, MinPause: 5 * time.Second, Timeout: 10 * time.Second}, 15 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.t.MaxTransactionLifetime(); got != tc.want {
				t.Fatalf("MaxTransactionLifetime = %v, want %v", got, tc.want)
			}
			if err := tc.t.Validate(); err != nil {
				t.Fatal(err)
			}
		})
	}
	for _, bad := range []Timing{{}, {Timeout: time.Second, RestartBudget: -1}, {Timeout: time.Second, TolerableFailures: -1}} {
		if err := bad.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalidConfig", bad, err)
		}
	}
}
