package checkpoint

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Transfer moves Transfers files at once, never more, calls fn once for
// each, and after a failure returns that error, starts no further call
// and cancels the context of the calls in flight.
func TestTransferMovesFilesConcurrentlyUpToItsLimitAndStopsAtTheFirstError(t *testing.T) {
	t.Run("concurrent", func(t *testing.T) {
		const n = 3 * Transfers
		var inFlight, peak atomic.Int32
		full := make(chan struct{})
		var once sync.Once
		called := make([]atomic.Int32, n)
		err := Transfer(t.Context(), n, func(ctx context.Context, i int) error {
			called[i].Add(1)
			now := inFlight.Add(1)
			defer inFlight.Add(-1)
			for p := peak.Load(); now > p && !peak.CompareAndSwap(p, now); p = peak.Load() {
			}
			if now == Transfers {
				once.Do(func() { close(full) })
			}
			select {
			case <-full: // the first calls wait until Transfers are in flight
			case <-time.After(10 * time.Second):
				return errors.New("never had Transfers calls in flight at once")
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if p := peak.Load(); p != Transfers {
			t.Fatalf("peak of %d calls in flight, want %d", p, Transfers)
		}
		for i := range called {
			if c := called[i].Load(); c != 1 {
				t.Fatalf("file %d transferred %d times, want once", i, c)
			}
		}
	})
	t.Run("first error", func(t *testing.T) {
		boom := errors.New("boom")
		var calls atomic.Int32
		var canceled atomic.Int32
		err := Transfer(t.Context(), 100, func(ctx context.Context, i int) error {
			calls.Add(1)
			if i == 0 {
				return boom
			}
			select {
			case <-ctx.Done():
				canceled.Add(1)
				return ctx.Err()
			case <-time.After(10 * time.Second):
				return nil
			}
		})
		if !errors.Is(err, boom) {
			t.Fatalf("Transfer = %v, want the first call's error", err)
		}
		if c := calls.Load(); c > Transfers {
			t.Fatalf("%d calls started, want at most the %d in flight when the first failed", c, Transfers)
		}
		if calls.Load() != canceled.Load()+1 {
			t.Fatalf("%d of the %d other calls saw their context canceled", canceled.Load(), calls.Load()-1)
		}
	})
}
