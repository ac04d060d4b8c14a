package runtime

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// seqJob builds source -> keyBy -> checker -> transactional sink.
func seqJob(src func() Source[seqRec], viol *violations, txns *memTxns, sinkFP func(string) error, srcPar, par int) *Job {
	return seqJobTo(src, viol, func() Sink[seqRec] { return &txnSink{txns: txns, fp: sinkFP} }, srcPar, par)
}

// seqJobTo builds source -> keyBy -> checker -> the sink newSink makes.
func seqJobTo(src func() Source[seqRec], viol *violations, newSink func() Sink[seqRec], srcPar, par int, opts ...JobOpt) *Job {
	j := NewJob("seq", append([]JobOpt{DefaultParallelism(par)}, opts...)...)
	recs := FromSource(j, "source", src, Parallelism(srcPar))
	keyed := KeyBy(recs, func(r seqRec) string { return r.Key }, nil)
	checked := Process(keyed, "checker", func() KeyedProcessFunction[string, seqRec, seqRec] {
		return &seqChecker{violations: viol}
	})
	SinkTo(checked, "sink", newSink)
	return j
}

func TestExactlyOnceStateAndOutputUnderRandomFailures(t *testing.T) {
	seeds := 40
	if testing.Short() {
		seeds = 4
	}
	for seed := int64(1); seed <= int64(seeds); seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runUnderRandomFailures(t, seed, 1, nil) })
	}
}

// runUnderRandomFailures runs the seq job (parallelism minPar to minPar+2)
// under seed's random failpoints with the cluster options extra adds, and
// checks that state and output are exactly-once.
func runUnderRandomFailures(t *testing.T, seed int64, minPar int, extra func(*Job) []ClusterOpt) {
	const keys, n = 20, 300
	r := newRand(seed)
	fp := &randomFailpoints{r: r, left: 1 + r.Intn(4), fired: map[string]int{}, prob: map[string]float64{
		"task.process":                  0.0005,
		"jm.after-checkpoint-persisted": 0.1,
		"sink.after-precommit":          0.05,
		"sink.after-commit":             0.05,
	}}
	viol := &violations{}
	txns := newMemTxns()
	src := seqSourceOf(seqSource{keys: keys, splits: 4, n: n, perPoll: 1 + r.Intn(3)})
	job := seqJob(src, viol, txns, fp.Inject, 1+r.Intn(2), minPar+r.Intn(3-minPar+1))
	opts := []ClusterOpt{CheckpointInterval(time.Duration(2+r.Intn(10)) * time.Millisecond),
		Failpoints(fp), Restarts(20, time.Millisecond), BatchSize(1 + r.Intn(64))}
	if extra != nil {
		opts = append(opts, extra(job)...)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	res, err := NewMiniCluster(opts...).Run(ctx, job)
	if err != nil {
		t.Fatalf("job failed: %v", err)
	}
	if v := viol.get(); len(v) > 0 {
		t.Fatalf("keyed state not exactly-once: %d violations, first: %s", len(v), v[0])
	}
	checkSequences(t, txns.output(), keys, n)
	t.Logf("restarts=%d last checkpoint=%d failpoints fired=%v", res.Restarts, res.LastCheckpoint, fp.fired)
}

func TestRestoreAtDifferentParallelismKeepsEveryKeysState(t *testing.T) {
	const keys, n = 30, 400
	for _, tc := range []struct{ from, to int }{{2, 3}, {3, 1}, {1, 4}} {
		t.Run(fmt.Sprintf("%d->%d", tc.from, tc.to), func(t *testing.T) {
			store, err := checkpoint.OpenStore(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			viol := &violations{}
			txns := newMemTxns()
			// First run: the source stalls halfway; stop it after a few
			// checkpoints.
			ctx, cancel := context.WithCancel(context.Background())
			var completed int
			mc := NewMiniCluster(CheckpointStore(store), CheckpointInterval(5*time.Millisecond),
				OnCheckpointComplete(func(CheckpointEvent) {
					if completed++; completed == 5 {
						cancel()
					}
				}))
			src := seqSourceOf(seqSource{keys: keys, splits: 6, n: n, perPoll: 1, stallAt: n / 2})
			_, err = mc.Run(ctx, seqJob(src, viol, txns, nil, tc.from, tc.from))
			cancel()
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("first run: %v", err)
			}
			before := len(txns.output())
			if before == 0 || before == keys*n {
				t.Fatalf("first run committed %d of %d records: want a run stopped mid-input", before, keys*n)
			}
			// Second run at another parallelism from the same store.
			mc = NewMiniCluster(CheckpointStore(store), CheckpointInterval(5*time.Millisecond))
			src = seqSourceOf(seqSource{keys: keys, splits: 6, n: n, perPoll: 3})
			if _, err := mc.Run(context.Background(), seqJob(src, viol, txns, nil, tc.to, tc.to)); err != nil {
				t.Fatal(err)
			}
			if v := viol.get(); len(v) > 0 {
				t.Fatalf("keyed state lost or repeated across rescale: %d violations, first: %s", len(v), v[0])
			}
			checkSequences(t, txns.output(), keys, n)
		})
	}
}

func TestTaskPanicIsATaskFailureWithItsStack(t *testing.T) {
	var panicked bool
	j := NewJob("panics")
	recs := FromSource(j, "source", seqSourceOf(seqSource{keys: 2, splits: 1, n: 50, perPoll: 1}))
	mapped := Map(recs, "boom", func(r seqRec) (seqRec, error) {
		if r.Seq == 10 && !panicked {
			panicked = true
			panic("boom at 10")
		}
		return r, nil
	})
	txns := newMemTxns()
	SinkTo(mapped, "sink", func() Sink[seqRec] { return &txnSink{txns: txns} })
	mc := NewMiniCluster(CheckpointInterval(5*time.Millisecond), Restarts(0, 0))
	_, err := mc.Run(context.Background(), j)
	var pe *panicError
	if !errors.As(err, &pe) || !errors.Is(err, ErrJobFailed) {
		t.Fatalf("want a job failure carrying the panic, got %v", err)
	}
	if !strings.Contains(err.Error(), "boom at 10") || !strings.Contains(string(pe.stack), "TestTaskPanicIsATaskFailureWithItsStack") {
		t.Fatalf("panic error lacks value or stack: %v", err)
	}
}

func TestInvalidJobsAreRefused(t *testing.T) {
	src := func() func() Source[seqRec] { return seqSourceOf(seqSource{keys: 1, splits: 1, n: 1, perPoll: 1}) }
	cases := []struct {
		name  string
		build func() *Job
		want  string
	}{
		{"duplicate uid", func() *Job {
			j := NewJob("dup")
			s := FromSource(j, "a", src())
			SinkTo(s, "a", func() Sink[seqRec] { return &txnSink{txns: newMemTxns()} })
			return j
		}, "share uid"},
		{"bad parallelism", func() *Job {
			j := NewJob("par")
			FromSource(j, "a", src(), Parallelism(0))
			return j
		}, "parallelism 0"},
		{"keyed parallelism above max", func() *Job {
			j := NewJob("max", MaxParallelism(4))
			s := FromSource(j, "a", src())
			Reduce(KeyBy(s, func(r seqRec) string { return r.Key }, nil), "r",
				func(a, b seqRec) (seqRec, error) { return b, nil }, nil, Parallelism(5))
			return j
		}, "exceeds max parallelism"},
		{"bad uid", func() *Job {
			j := NewJob("uid")
			FromSource(j, "a", src(), UID("has space"))
			return j
		}, "uid"},
		{"no source", func() *Job { return NewJob("empty") }, "no source"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewMiniCluster().Run(context.Background(), tc.build())
			if !errors.Is(err, ErrInvalidJob) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrInvalidJob mentioning %q", err, tc.want)
			}
		})
	}
}
