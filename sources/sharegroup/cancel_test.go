package sharegroup

import (
	"testing"
	"time"

	"github.com/weirstream/weir/internal/kafkatest"
)

// A cancel (Close) waits for each idle lane's share fetch in flight (and
// what it buffers, see takeUnpolled) before anything is released: it ends
// within the fetch's wait at the broker (laneFetchWait), 250 ms, not a
// second, even when the fetch was sent just before the cancel and nothing
// arrives to end it sooner. The records a sibling lane held come back, each
// once.
func TestACancelWaitsForAnIdleLanesFetchAQuarterSecondNotASecond(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for long polls")
	}
	const n = 10
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", n)
	s := openSource(t, env, 0, nil, Lanes(2))
	if got := pollFor(t, s, n, 20*time.Second); len(got) != n {
		t.Fatalf("polled %d records, want %d", len(got), n)
	}
	// Lane 0 holds the batch; lane 1 starts once it was admitted, and
	// finds nothing.
	pollFor(t, s, 1, 300*time.Millisecond)
	// Cancel right after lane 1's client sent a fetch: nothing arrives, so
	// the broker answers it when its wait is over.
	idle := s.lanes[1]
	deadline := time.Now().Add(10 * time.Second)
	for !fetchJustSent(&idle.fetches) {
		if time.Now().After(deadline) {
			t.Fatal("the idle lane's client sent no share fetch")
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("the cancel took %v (fetch wait %v)", took, laneFetchWait)
	// The wait (250 ms), takeUnpolled's grace (250 ms) and the close's
	// round trips; the wait of 1 s it had before, with the grace, overshoots
	// it.
	if bound := 950 * time.Millisecond; took > bound {
		t.Fatalf("the cancel took %v, want under %v", took, bound)
	}
	b := openSource(t, env, 1, nil)
	got := pollFor(t, b, n, 20*time.Second)
	if msg := exactlyOnce(counts(t, got), n); msg != "" {
		t.Fatalf("after the cancel: %s", msg)
	}
}

// fetchJustSent returns whether a share fetch is in flight that was sent
// within the last 20 ms.
func fetchJustSent(f *inFlight) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n > 0 && time.Since(f.sent) < 20*time.Millisecond
}
