package runtime

import (
	"context"
	"sync"
	"testing"
)

// A task manager's report (an ack, a decline) can arrive while the attempt
// is waiting for its report goroutines, after its driver stopped: it must be
// dropped, never start a goroutine then (that reuse of the WaitGroup during
// its Wait panicked the job manager, TestSubmittedJobContinuesExactlyOnce
// AfterTheJobManagerIsSIGKILLed), while reports before the end all run.
func TestReportsRaceTheEndOfTheAttemptWithoutPanicking(t *testing.T) {
	for range 200 {
		a := &attempt{ctx: t.Context()}
		var ran sync.WaitGroup
		ran.Add(1)
		a.report(func(context.Context) error { ran.Done(); return nil })
		ran.Wait() // a report before the end runs
		var late sync.WaitGroup
		late.Add(1)
		go func() {
			defer late.Done()
			for range 50 {
				a.report(func(context.Context) error { return nil })
			}
		}()
		a.reportsMu.Lock()
		a.reportsOver = true
		a.reportsMu.Unlock()
		a.reports.Wait()
		late.Wait()
		called := false
		a.report(func(context.Context) error { called = true; return nil })
		a.reports.Wait()
		if called {
			t.Fatal("a report after the attempt ended ran")
		}
	}
}
