package runtime

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// splitClicks is a source whose subtask s emits the clicks of items[s]
// (then, when stall, nothing more: an endless source with nothing to read).
type splitClicks struct {
	items   [][]click
	stall   bool
	mine    []click
	blocked *atomic.Int64 // the longest Collect (ns): time blocked downstream
}

func (s *splitClicks) Open(_ context.Context, oc *OperatorContext) error {
	s.mine = s.items[oc.Subtask]
	return nil
}

func (s *splitClicks) Poll(_ context.Context, out Collector[click]) error {
	if len(s.mine) == 0 {
		if s.stall {
			time.Sleep(time.Millisecond)
			return nil
		}
		return ErrEndOfInput
	}
	start := time.Now()
	out.Collect(s.mine[0])
	if s.blocked != nil {
		d := int64(time.Since(start))
		for old := s.blocked.Load(); d > old && !s.blocked.CompareAndSwap(old, d); old = s.blocked.Load() {
		}
	}
	s.mine = s.mine[1:]
	return nil
}

func (s *splitClicks) Snapshot(context.Context, checkpoint.ID) (OperatorState, error) {
	return OperatorState{}, nil
}
func (s *splitClicks) Close() error { return nil }

// An idle source subtask (nothing to read for the idleness timeout) does
// not stall the watermark: the other subtask's events fire although one
// subtask never emits anything and the input never ends.
func TestAnIdleSourceSubtaskDoesNotStallTheWatermark(t *testing.T) {
	cs := clicks(400, 5)
	const bound = 500
	var maxTS int64
	for _, c := range cs {
		maxTS = max(maxTS, c.TS)
	}
	var due []click // what the watermark of the busy subtask releases
	for _, c := range cs {
		if c.TS <= maxTS-bound-1 {
			due = append(due, c)
		}
	}
	txns := newMemTxns()
	j := NewJob("idle", DefaultParallelism(2), MaxParallelism(16))
	ws := ForBoundedOutOfOrderness[click](bound*time.Millisecond,
		WithTimestampAssigner(func(c click, _ int64) int64 { return c.TS }),
		WithIdleness(50*time.Millisecond), WithWatermarkInterval(5*time.Millisecond))
	events := FromSource(j, "clicks", func() Source[click] {
		return &splitClicks{items: [][]click{cs, nil}, stall: true}
	}, Watermarks(ws))
	sorted := ProcessKeyed(KeyBy(events, func(c click) string { return c.Key }, nil), "sort",
		func() KeyedProcessor[string, click, seqRec] { return &lateSorter{} })
	SinkTo(sorted, "sink", func() Sink[seqRec] { return &txnSink{txns: txns} })
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	mc := NewMiniCluster(CheckpointInterval(10*time.Millisecond), OnCheckpointComplete(func(CheckpointEvent) {
		if len(txns.output()) >= len(due) {
			cancel()
		}
	}))
	if _, err := mc.Run(ctx, j); !errors.Is(err, context.Canceled) {
		t.Errorf("the job (stopped once every due event was committed): %v", err)
	}
	checkSorted(t, txns.output(), sortedByKey(due))
}

// Back-pressure is not idleness: source subtasks blocked sending to a slow
// operator for far longer than the idleness timeout are never marked idle,
// so the slow subtask's (early) events never become late behind the fast
// subtask's (late) watermark. Every event comes out once, in event-time
// order, none to the late side output.
func TestABackPressuredSourceIsNeverIdle(t *testing.T) {
	const n = 300
	var early, far []click
	for i := 0; i < n; i++ {
		early = append(early, click{Key: "a", TS: int64(1000 + i), ID: i})
		far = append(far, click{Key: "b", TS: int64(1_000_000 + i), ID: n + i})
	}
	idleness := 2 * time.Millisecond
	var blocked atomic.Int64
	txns := newMemTxns()
	var late atomic.Int64
	j := NewJob("backpressure", DefaultParallelism(2), MaxParallelism(16))
	ws := ForMonotonousTimestamps[click](
		WithTimestampAssigner(func(c click, _ int64) int64 { return c.TS }),
		WithIdleness(idleness), WithWatermarkInterval(time.Millisecond))
	events := FromSource(j, "clicks", func() Source[click] {
		return &splitClicks{items: [][]click{early, far}, blocked: &blocked}
	}, Watermarks(ws))
	slow := Map(events, "slow", func(c click) (click, error) {
		time.Sleep(3 * idleness / 2)
		return c, nil
	}, Parallelism(1))
	sorted := ProcessKeyed(KeyBy(slow, func(c click) string { return c.Key }, nil), "sort",
		func() KeyedProcessor[string, click, seqRec] { return &lateSorter{} }, Parallelism(1))
	SinkTo(sorted, "sink", func() Sink[seqRec] { return &txnSink{txns: txns} }, Parallelism(1))
	SinkTo(SideOutput(sorted, lateClicks), "late", SinkFunc(func(context.Context, click) error {
		late.Add(1)
		return nil
	}), Parallelism(1))
	if _, err := NewMiniCluster(CheckpointInterval(20*time.Millisecond), BatchSize(1), ChannelCapacity(1)).Run(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	if b := time.Duration(blocked.Load()); b < 2*idleness {
		t.Fatalf("the sources were blocked at most %v: no back-pressure longer than the idleness timeout %v, nothing tested", b, idleness)
	}
	if late.Load() != 0 {
		t.Errorf("%d events went late: a back-pressured source was taken for idle", late.Load())
	}
	checkSorted(t, txns.output(), sortedByKey(append(append([]click(nil), early...), far...)))
}
