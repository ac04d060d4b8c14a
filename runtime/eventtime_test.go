package runtime

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/weirstream/weir/checkpoint"
)

// stampedSource emits n records i (0..n-1) of its subtask's share (i%p ==
// subtask) with timestamp stampOf(i), through CollectWithTimestamp.
type stampedSource struct {
	n, next, step int
}

func stampOf(i int) int64 { return 1_700_000_000_000 + int64(i)*7 - int64(i%3)*1000 }

func (s *stampedSource) Open(_ context.Context, oc *OperatorContext) error {
	s.next, s.step = oc.Subtask, oc.Parallelism
	return nil
}

func (s *stampedSource) Poll(_ context.Context, out Collector[int]) error {
	for k := 0; k < 16; k++ {
		if s.next >= s.n {
			return ErrEndOfInput
		}
		out.(TimestampCollector[int]).CollectWithTimestamp(s.next, stampOf(s.next))
		s.next += s.step
	}
	return nil
}

func (s *stampedSource) Snapshot(context.Context, checkpoint.ID) (OperatorState, error) {
	return OperatorState{}, nil
}
func (s *stampedSource) Close() error { return nil }

// stampSink records every record with the timestamp it arrived with.
type stampSink struct {
	oc  *OperatorContext
	mu  *sync.Mutex
	got map[string]int64
	dup *atomic.Int64
}

func (s *stampSink) Open(_ context.Context, oc *OperatorContext) error { s.oc = oc; return nil }
func (s *stampSink) Write(_ context.Context, v string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.got[v]; ok {
		s.dup.Add(1)
	}
	s.got[v] = s.oc.RecordTimestamp()
	return nil
}
func (s *stampSink) Snapshot(context.Context, checkpoint.ID) (OperatorState, error) {
	return OperatorState{}, nil
}
func (s *stampSink) Close() error { return nil }

// Every record keeps its source timestamp through Map, FlatMap and Filter
// (chained), a rebalance and a hash edge, in process and across an
// Exchange (the data plane's encoding), checked record by record.
func TestRecordTimestampsSurviveChainsChannelsAndTheDataPlane(t *testing.T) {
	const n = 3000
	for _, tc := range []struct {
		name  string
		split bool
	}{{"in-process", false}, {"across-an-exchange", true}} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			got := map[string]int64{}
			var dup atomic.Int64
			j := NewJob("stamps", DefaultParallelism(2))
			src := FromSource(j, "source", func() Source[int] { return &stampedSource{n: n} })
			plus := Map(src, "plus", func(i int) (int, error) { return i + 1, nil })
			twice := FlatMap(plus, "twice", func(i int, out Collector[string]) error {
				out.Collect(fmt.Sprintf("a%d", i-1))
				out.Collect(fmt.Sprintf("b%d", i-1))
				return nil
			})
			kept := Filter(Rebalance(twice), "keep", func(string) bool { return true }, Parallelism(3))
			keyed := KeyBy(kept, func(s string) string { return s }, nil)
			same := Process(keyed, "same", func() KeyedProcessFunction[string, string, string] {
				return ProcessFunc[string, string, string](func(_ string, v string, out Collector[string]) error {
					out.Collect(v)
					return nil
				})
			})
			SinkTo(same, "sink", func() Sink[string] { return &stampSink{mu: &mu, got: got, dup: &dup} })
			var opts []ClusterOpt
			var sent atomic.Int64
			if tc.split {
				opts = append(opts, Deployment(splitDeployer{job: j, parts: 2, sent: &sent}))
			}
			if _, err := NewMiniCluster(opts...).Run(t.Context(), j); err != nil {
				t.Fatal(err)
			}
			if tc.split && sent.Load() == 0 {
				t.Fatal("nothing crossed the exchange")
			}
			if dup.Load() != 0 {
				t.Errorf("%d duplicates", dup.Load())
			}
			if len(got) != 2*n {
				t.Errorf("%d records, want %d", len(got), 2*n)
			}
			for i := 0; i < n; i++ {
				for _, p := range []string{"a", "b"} {
					k := fmt.Sprintf("%s%d", p, i)
					ts, ok := got[k]
					if !ok {
						t.Errorf("%s lost", k)
					} else if ts != stampOf(i) {
						t.Errorf("%s: timestamp %d, want %d", k, ts, stampOf(i))
					}
				}
			}
		})
	}
}

// What a checkpoint keeps of a source's watermark: the last one sent, or
// the restored one not sent yet; nothing before the first, and nothing
// after the final one (a drained or ended source resumed with it would
// make every record late).
func TestACheckpointKeepsTheSourcesLastWatermarkButNeverTheFinalOne(t *testing.T) {
	strategy := ForMonotonousTimestamps[int]()
	at := func(wm int64) *int64 { return &wm }
	for _, tc := range []struct {
		name     string
		strategy *WatermarkStrategy[int]
		sent     []int64
		restored *int64
		want     *int64
	}{
		{"no strategy", nil, nil, nil, nil},
		{"none sent yet", &strategy, nil, nil, nil},
		{"the last sent", &strategy, []int64{5, 9}, nil, at(9)},
		{"restored, not sent yet", &strategy, nil, at(7), at(7)},
		{"sent past the restored one", &strategy, []int64{8}, at(7), at(8)},
		{"the final one", &strategy, []int64{5, MaxWatermark}, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newSourceWatermarks(tc.strategy)
			w.restore(tc.restored)
			if tc.restored != nil && tc.sent != nil {
				if err := w.resume(); err != nil {
					t.Fatal(err)
				}
			}
			for _, wm := range tc.sent {
				w.emitWatermark(wm)
			}
			got := w.snapshotWatermark()
			if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
				t.Fatalf("kept %v, want %v", deref(got), deref(tc.want))
			}
		})
	}
}
