package kafkatxn

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/broker/brokerproc"
)

// withRecommitHook sets cfg.recommitHook.
func withRecommitHook(fn func(partitions int)) Opt {
	return opt{func(c *cfg) { c.recommitHook = fn }}
}

// TestRecommitInterruptedByABrokerCrashIsRedoneCompletely: the embedded
// broker (a real process) crashes after a checkpoint's transaction was
// pre-committed, so recovery re-commits the lost transaction by copying its
// records (markers.go); the broker is SIGKILLed again in the middle of that
// copy (after some partitions' copies were produced, or after all of them,
// before the commit) and restarts on the same data dir. Once a recovery
// reports success, every record of the lost transaction must be visible
// read_committed exactly once, in its original order on its partition, and
// stay so when recovery from the same checkpoint runs again.
//
// "twice": the restarted broker repairs the data dir (aborting the copies
// on disk) and is SIGKILLed again before the copy's client got through to
// it, as when the random crashes of the process test come in quick
// succession. kfake fences a crash's orphaned producer epoch in memory only;
// before the embedded broker made that fence durable (internal/broker
// fenceOrphans), the second restart accepted the interrupted copy's client
// at its old epoch and the copy committed only the partitions it wrote
// after the crashes. Now the copy's client is fenced; either way the
// recovery must fail (ErrRecommitIncomplete) and the next recovery copy
// only what is missing.
func TestRecommitInterruptedByABrokerCrashIsRedoneCompletely(t *testing.T) {
	const perPartition = 40
	records := func() []*kgo.Record { // kgo owns a record once produced: fresh ones per run
		var recs []*kgo.Record
		for i := range perPartition {
			for p := range int32(testPartitions) {
				recs = append(recs, rec(p, fmt.Sprintf("p%d-%03d", p, i)))
			}
		}
		return recs
	}
	var want [testPartitions][]string
	for _, r := range records() {
		want[r.Partition] = append(want[r.Partition], string(r.Value))
	}
	for _, tc := range []struct {
		at    int // partitions whose copies were produced when the broker is killed
		twice bool
	}{
		{1, false},
		{2, false},
		{1, true},
		{2, true},
		{testPartitions, false}, // every copy produced, none committed
		{testPartitions, true},
	} {
		name := fmt.Sprintf("crash-after-partition-%d-of-%d", tc.at, testPartitions)
		if tc.twice {
			name += "-twice"
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			dir := t.TempDir()
			p, addrs := processBroker(t, dir)
			w1, h := precommitted(t, addrs, records()...)
			w1.crash()
			p.Kill(t) // crash 1: the broker loses the pre-committed transaction
			p = brokerproc.Start(t, dir, p.Addr)

			crashed := false
			hook := withRecommitHook(func(partitions int) {
				if partitions < tc.at || crashed {
					return
				}
				crashed = true
				p.Kill(t) // crash 2, in the middle of the copy
				p = brokerproc.Start(t, dir, p.Addr)
				if tc.twice {
					p.Kill(t)
					p = brokerproc.Start(t, dir, p.Addr)
				}
			})
			var errs []error
			for attempt := 1; ; attempt++ {
				if attempt > 5 {
					t.Fatalf("recovery did not succeed in 5 attempts: %v", errs)
				}
				w := newWriter(t, ctx, addrs, hook, Logger(zaptest.NewLogger(t)))
				err := w.Recover(ctx, []checkpoint.TxnHandle{h})
				w.Close()
				if err == nil {
					break
				}
				t.Logf("recovery attempt %d: %v", attempt, err)
				if !errors.Is(err, ErrRecommitIncomplete) || errors.Is(err, ErrTxnLost) {
					t.Fatalf("recovery attempt %d = %v, want an error wrapping ErrRecommitIncomplete, not ErrTxnLost", attempt, err)
				}
				errs = append(errs, err)
			}
			if !crashed {
				t.Fatalf("the broker was never crashed during the copy (fewer than %d partitions copied)", tc.at)
			}
			checkExactly(t, ctx, addrs, want, "after the recovery that reported success")

			// A second recovery from the same checkpoint copies nothing.
			w := newWriter(t, ctx, addrs)
			err := w.Recover(ctx, []checkpoint.TxnHandle{h})
			w.Close()
			if err != nil {
				t.Fatalf("second recovery: %v", err)
			}
			checkExactly(t, ctx, addrs, want, "after a second recovery from the same checkpoint")
		})
	}
}

// checkExactly reads the test topic read_committed and requires every
// partition to hold exactly want's values, in order: each record once.
func checkExactly(t *testing.T, ctx context.Context, addrs []string, want [testPartitions][]string, when string) {
	t.Helper()
	got := readCommitted(t, ctx, addrs)
	for p := range want {
		if !slices.Equal(got[p], want[p]) {
			t.Fatalf("%s, partition %d holds %d records, want %d (each record of the lost transaction once, in order):%s",
				when, p, len(got[p]), len(want[p]), diffValues(got[p], want[p]))
		}
	}
}

// diffValues describes how got differs from want: missing, duplicated and
// unexpected values, and the first position where they diverge.
func diffValues(got, want []string) string {
	count := map[string]int{}
	for _, v := range got {
		count[v]++
	}
	var missing, dup []string
	for _, v := range want {
		switch c := count[v]; {
		case c == 0:
			missing = append(missing, v)
		case c > 1:
			dup = append(dup, fmt.Sprintf("%s x%d", v, c))
		}
		delete(count, v)
	}
	var extra []string
	for v := range count {
		extra = append(extra, v)
	}
	slices.Sort(extra)
	first := -1
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			first = i
			break
		}
	}
	return fmt.Sprintf("\n  missing %d: %v\n  duplicated: %v\n  unexpected: %v\n  first divergence at index %d",
		len(missing), missing, dup, extra, first)
}
