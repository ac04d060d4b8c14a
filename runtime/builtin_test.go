package runtime

import (
	"fmt"
	"testing"
	"time"
)

// A SliceSource restored at another parallelism emits every item not yet
// committed exactly once: its progressions are redistributed, none is
// repeated or dropped.
func TestSliceSourceRescaleEmitsEveryItemOnce(t *testing.T) {
	const n = 6000
	items := make([]seqRec, n)
	for i := range items {
		items[i] = seqRec{Key: "k", Seq: int64(i + 1)}
	}
	for _, tc := range []struct{ from, to int }{{2, 3}, {3, 2}, {1, 4}, {4, 1}} {
		t.Run(fmt.Sprintf("%d->%d", tc.from, tc.to), func(t *testing.T) {
			store := openStore(t)
			txns := newMemTxns()
			job := func(par int, pause time.Duration) *Job {
				j := NewJob("slice", DefaultParallelism(par))
				s := FromSource(j, "items", SliceSource(items, 5))
				s = Map(s, "slow", func(r seqRec) (seqRec, error) { time.Sleep(pause); return r, nil })
				SinkTo(s, "sink", func() Sink[seqRec] { return &txnSink{txns: txns} })
				return j
			}
			runUntilCheckpoints(t, store, job(tc.from, 200*time.Microsecond), 4)
			before := len(txns.output())
			if before == 0 || before == n {
				t.Fatalf("first run committed %d of %d items: want a run stopped mid-input", before, n)
			}
			if _, err := NewMiniCluster(CheckpointStore(store), CheckpointInterval(5*time.Millisecond)).
				Run(t.Context(), job(tc.to, 0)); err != nil {
				t.Fatal(err)
			}
			count := map[int64]int{}
			for _, r := range txns.output() {
				count[r.Seq]++
			}
			var dups, lost []int64
			for i := int64(1); i <= n; i++ {
				switch c := count[i]; {
				case c == 0:
					lost = append(lost, i)
				case c > 1:
					dups = append(dups, i)
				}
			}
			if len(dups) > 0 || len(lost) > 0 {
				t.Fatalf("%d items emitted twice (first %v), %d never (first %v)", len(dups), head(dups), len(lost), head(lost))
			}
		})
	}
}

func head(s []int64) []int64 { return s[:min(len(s), 5)] }
