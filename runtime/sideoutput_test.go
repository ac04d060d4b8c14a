package runtime

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// punctuated emits a watermark after every record: the largest timestamp
// seen minus bound minus 1 (deterministic, unlike the periodic emission).
type punctuated struct {
	bound, maxTS int64
}

func (p *punctuated) OnEvent(_ click, ts int64, out WatermarkOutput) {
	p.maxTS = max(p.maxTS, ts)
	out.EmitWatermark(p.maxTS - p.bound - 1)
}
func (p *punctuated) OnPeriodicEmit(WatermarkOutput) {}

var lateClicks = NewOutputTag[click]("late-clicks")

// lateSorter is eventTimeSorter with late events sent to lateClicks.
type lateSorter struct{ eventTimeSorter }

func (s *lateSorter) ProcessElement(ctx *KeyedContext[string], c click, out Collector[seqRec]) error {
	if c.TS <= ctx.CurrentWatermark() {
		Output(ctx, lateClicks, c)
		return nil
	}
	return s.eventTimeSorter.ProcessElement(ctx, c, out)
}

// Late events go to a side output, read as a stream by another operator in
// another part of a split deployment (the side output's records cross an
// Exchange with their edge's codec): each late event exactly once there,
// every other event once in event-time order on the main output. Which
// events are late is known in advance: with one source subtask and a
// watermark after every event, event i is late iff its timestamp is at or
// below the largest earlier timestamp minus the bound minus 1.
func TestLateEventsReachTheSideOutputAcrossAnExchange(t *testing.T) {
	const bound = 500
	cs := clicks(1500, 11)
	for i := range cs {
		if i%37 == 36 {
			cs[i].TS -= 3000 // far behind: late
		}
	}
	var wantLate []int
	var onTime []click
	maxTS := MinWatermark + bound + 1
	for _, c := range cs {
		if c.TS <= maxTS-bound-1 {
			wantLate = append(wantLate, c.ID)
		} else {
			onTime = append(onTime, c)
		}
		maxTS = max(maxTS, c.TS)
	}
	if len(wantLate) < 20 {
		t.Fatalf("only %d late events in the input", len(wantLate))
	}
	txns := newMemTxns()
	var mu sync.Mutex
	var gotLate []int
	j := NewJob("late", DefaultParallelism(2), MaxParallelism(32))
	ws := ForGenerator(func() WatermarkGenerator[click] { return &punctuated{bound: bound, maxTS: MinWatermark + bound + 1} },
		WithTimestampAssigner(func(c click, _ int64) int64 { return c.TS }))
	events := FromSource(j, "clicks", SliceSource(cs, 7), Parallelism(1), Watermarks(ws))
	sorted := ProcessKeyed(KeyBy(events, func(c click) string { return c.Key }, nil), "sort",
		func() KeyedProcessor[string, click, seqRec] { return &lateSorter{} })
	SinkTo(sorted, "sink", func() Sink[seqRec] { return &txnSink{txns: txns} })
	late := Map(SideOutput(sorted, lateClicks), "late-id", func(c click) (int, error) { return c.ID, nil }, Parallelism(3))
	SinkTo(late, "late-sink", SinkFunc(func(_ context.Context, id int) error {
		mu.Lock()
		defer mu.Unlock()
		gotLate = append(gotLate, id)
		return nil
	}), Parallelism(3))
	var sent atomic.Int64
	mc := NewMiniCluster(CheckpointInterval(20*time.Millisecond), Restarts(0, 0),
		Deployment(splitDeployer{job: j, parts: 2, sent: &sent}))
	if _, err := mc.Run(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	slices.Sort(gotLate)
	if !slices.Equal(gotLate, wantLate) {
		t.Errorf("late events: got %d %v, want %d %v", len(gotLate), gotLate, len(wantLate), wantLate)
	}
	checkSorted(t, txns.output(), sortedByKey(onTime))
}

// A side output read with two types is refused when the job is built.
func TestSideOutputReadAsTwoTypesIsAnInvalidJob(t *testing.T) {
	j := NewJob("two-types")
	events := FromSource(j, "clicks", SliceSource([]click{{Key: "a"}}, 0))
	sorted := ProcessKeyed(KeyBy(events, func(c click) string { return c.Key }, nil), "sort",
		func() KeyedProcessor[string, click, seqRec] { return &lateSorter{} })
	SinkTo(SideOutput(sorted, lateClicks), "a", SinkFunc(func(context.Context, click) error { return nil }))
	SinkTo(SideOutput(sorted, NewOutputTag[string]("late-clicks")), "b", SinkFunc(func(context.Context, string) error { return nil }))
	if _, err := j.Describe(); err == nil {
		t.Fatal("want an invalid job")
	} else if !strings.Contains(err.Error(), `"late-clicks"`) {
		t.Fatalf("error %v does not name the tag", err)
	}
}
