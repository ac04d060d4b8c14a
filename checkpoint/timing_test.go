package checkpoint

import (
	"errors"
	"sync"
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

// Latest keeps the highest id noted, whatever the order the notes arrive
// in and from however many goroutines.
func TestLatestKeepsTheHighestIDNotedConcurrently(t *testing.T) {
	var l Latest
	if got := l.Load(); got != 0 {
		t.Fatalf("zero Latest holds %d, want 0", got)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1000; i > 0; i-- { // descending: most notes are lower than what is held
				l.Note(ID(i*8 + g))
			}
		}()
	}
	wg.Wait()
	if got := l.Load(); got != 1000*8+7 {
		t.Fatalf("Latest holds %d, want %d", got, 1000*8+7)
	}
	l.Note(3)
	if got := l.Load(); got != 1000*8+7 {
		t.Fatalf("a lower note moved Latest to %d", got)
	}
}

// A restart budget given term by term covers its terms, none negative.
func TestRestartBudgetMustCoverItsFailoverTerms(t *testing.T) {
	f := Failover{Detection: 3 * time.Second, SlotWait: time.Minute, RestartDelay: time.Minute, Recovery: time.Minute}
	for _, tc := range []struct {
		name string
		t    Timing
		ok   bool
	}{
		{"budget equal to the terms", Timing{Timeout: time.Minute, RestartBudget: f.Total(), Failover: f}, true},
		{"budget above the terms", Timing{Timeout: time.Minute, RestartBudget: time.Hour, Failover: f}, true},
		{"budget below the terms", Timing{Timeout: time.Minute, RestartBudget: 2 * time.Minute, Failover: f}, false},
		{"negative term", Timing{Timeout: time.Minute, RestartBudget: time.Minute, Failover: Failover{Detection: -time.Second, Recovery: time.Minute}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.t.Validate(); (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalidConfig)) {
				t.Fatalf("Validate = %v, want ok %v", err, tc.ok)
			}
		})
	}
}
