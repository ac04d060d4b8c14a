package runtime

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// Union state (UnionState): every subtask restores every entry of every
// subtask, at the checkpoint's parallelism and at any other, entries by
// reference included; an operator without it keeps the split rules.
func TestAssignStateGivesUnionStateEveryEntryInEverySubtask(t *testing.T) {
	c := completedOf(3,
		checkpoint.OperatorSnapshot{UID: "src", Subtask: 0, Parallelism: 2, State: [][]byte{[]byte("a"), []byte("b")}},
		checkpoint.OperatorSnapshot{UID: "src", Subtask: 1, Parallelism: 2, State: [][]byte{[]byte("c")},
			StateRefs: []checkpoint.StateRef{{Key: "d"}}},
	)
	for _, tc := range []struct {
		par   int
		union bool
		want  func(i int) []string
	}{
		{1, true, func(int) []string { return []string{"a", "b", "c"} }},
		{2, true, func(int) []string { return []string{"a", "b", "c"} }},
		{3, true, func(int) []string { return []string{"a", "b", "c"} }},
		{2, false, func(i int) []string { return [][]string{{"a", "b"}, {"c"}}[i] }},
		{3, false, func(i int) []string { return [][]string{{"a"}, {"b"}, {"c"}}[i] }},
	} {
		t.Run(fmt.Sprintf("parallelism %d union %v", tc.par, tc.union), func(t *testing.T) {
			as, err := AssignState([]OperatorLayout{{UID: "src", Parallelism: tc.par, Union: tc.union}}, RestoreInput{Checkpoint: c})
			if err != nil {
				t.Fatal(err)
			}
			refs := 0
			for i := range tc.par {
				st := as.Subtasks[OperatorSubtask{"src", i}]
				var got []string
				for _, e := range st.Entries {
					got = append(got, string(e))
				}
				slices.Sort(got)
				if !slices.Equal(got, tc.want(i)) {
					t.Errorf("subtask %d restores %v, want %v", i, got, tc.want(i))
				}
				refs += len(st.EntryRefs)
				if tc.union && len(st.EntryRefs) != 1 {
					t.Errorf("subtask %d restores %d entries by reference, want the 1", i, len(st.EntryRefs))
				}
			}
			if !tc.union && refs != 1 {
				t.Errorf("%d entries by reference over the subtasks, want 1", refs)
			}
		})
	}
}

// unionSource is a source with union state, for the layout.
type unionSource struct{ SliceSourceStub }

// SliceSourceStub is a source that ends at once.
type SliceSourceStub struct{}

func (SliceSourceStub) Open(context.Context, *OperatorContext) error { return nil }
func (SliceSourceStub) Poll(context.Context, Collector[int]) error   { return ErrEndOfInput }
func (SliceSourceStub) Close() error                                 { return nil }
func (SliceSourceStub) Snapshot(context.Context, checkpoint.ID) (OperatorState, error) {
	return OperatorState{}, nil
}
func (unionSource) UnionState() {}

// The job graph's layout marks a source and a sink implementing
// UnionState, and only them. What they declare is recorded when the graph
// is built: computing the layout (at every restore) constructs no user
// operator.
func TestLayoutMarksUnionStateWithoutConstructingUserOperators(t *testing.T) {
	var made atomic.Int32
	j := NewJob("u")
	a := FromSource(j, "a", func() Source[int] { made.Add(1); return unionSource{} })
	b := FromSource(j, "b", func() Source[int] { made.Add(1); return SliceSourceStub{} })
	SinkTo(a, "sa", func() Sink[int] { made.Add(1); return unionSink{} })
	SinkTo(b, "sb", SinkFunc(func(context.Context, int) error { return nil }))
	p, err := compile(j)
	if err != nil {
		t.Fatal(err)
	}
	built := made.Load()
	for _, l := range p.layout() {
		if want := l.UID == "a" || l.UID == "sa"; l.Union != want {
			t.Errorf("operator %q: union %v, want %v", l.UID, l.Union, want)
		}
	}
	if n := made.Load() - built; n != 0 {
		t.Errorf("%d user operators constructed to lay out the restore, want none", n)
	}
}

// unionSink is a sink with union state.
type unionSink struct{}

func (unionSink) Open(context.Context, *OperatorContext) error { return nil }
func (unionSink) Write(context.Context, int) error             { return nil }
func (unionSink) Close() error                                 { return nil }
func (unionSink) Snapshot(context.Context, checkpoint.ID) (OperatorState, error) {
	return OperatorState{}, nil
}
func (unionSink) UnionState() {}

// splitOut records what a source subtask's watermark machinery sends.
type splitOut struct {
	wms  []int64
	idle []bool // status changes, in order
}

func newSplitMachine(idleness time.Duration) (*sourceWatermarks[int], *splitOut, *sourceCollector[int]) {
	ws := ForMonotonousTimestamps[int](WithIdleness(idleness), WithWatermarkInterval(time.Nanosecond))
	w := newSourceWatermarks(&ws)
	out := &splitOut{}
	w.emit = func(e envelope) error {
		switch e.mark {
		case markWatermark:
			out.wms = append(out.wms, e.wm)
		case markIdle:
			out.idle = append(out.idle, true)
		case markActive:
			out.idle = append(out.idle, false)
		}
		return nil
	}
	c := &sourceCollector[int]{collector: collector[int]{push: func(int) error { return nil }}, now: &recordTime{}, wms: w}
	return w, out, c
}

// Per-split watermarks (SplitCollector): the subtask's watermark is the
// minimum over its splits; a declared split that emits nothing holds it
// back until it is idle; a split dropped no longer counts; every split
// idle (or none) makes the subtask idle, and a record makes it active.
func TestSplitWatermarksAreTheMinimumOverSplitsThatAreNotIdle(t *testing.T) {
	w, out, c := newSplitMachine(time.Second)
	t0 := time.Now()
	last := func() int64 {
		if len(out.wms) == 0 {
			return MinWatermark
		}
		return out.wms[len(out.wms)-1]
	}
	c.SetSplits([]string{"a", "b", "c"})
	c.CollectFromSplit("a", 1, 100)
	c.CollectFromSplit("b", 2, 50)
	if err := w.afterPoll(t0, 2); err != nil {
		t.Fatal(err)
	}
	if got := last(); got > MinWatermark {
		t.Fatalf("watermark %d while split c emitted nothing and is not idle, want none", got)
	}
	c.CollectFromSplit("a", 1, 200)
	c.CollectFromSplit("b", 2, 60)
	if err := w.afterPoll(t0.Add(1500*time.Millisecond), 2); err != nil { // c idle now
		t.Fatal(err)
	}
	if got := last(); got != 59 {
		t.Fatalf("watermark %d, want split b's 59 (c idle, a ahead)", got)
	}
	c.SetSplits([]string{"a"}) // b finished
	if err := w.afterPoll(t0.Add(1600*time.Millisecond), 0); err != nil {
		t.Fatal(err)
	}
	if got := last(); got != 199 {
		t.Fatalf("watermark %d after b was dropped, want a's 199", got)
	}
	if err := w.afterPoll(t0.Add(3*time.Second), 0); err != nil { // a idle too
		t.Fatal(err)
	}
	if !slices.Equal(out.idle, []bool{true}) {
		t.Fatalf("status changes %v, want the subtask idle once every split is", out.idle)
	}
	c.CollectFromSplit("a", 1, 300)
	if err := w.afterPoll(t0.Add(3100*time.Millisecond), 1); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(out.idle, []bool{true, false}) || last() != 299 {
		t.Fatalf("after a record: status %v, watermark %d; want active again at 299", out.idle, last())
	}
	c.SetSplits(nil)
	if err := w.afterPoll(t0.Add(3200*time.Millisecond), 0); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(out.idle, []bool{true, false, true}) {
		t.Fatalf("status %v, want a subtask without splits idle", out.idle)
	}
}

// When every split is idle the subtask emits the largest watermark any
// split reached, then turns idle: nothing waits for an idle split.
func TestAllIdleSplitsEmitTheLargestWatermarkThenIdle(t *testing.T) {
	w, out, c := newSplitMachine(time.Second)
	t0 := time.Now()
	c.SetSplits([]string{"a", "b"})
	c.CollectFromSplit("a", 1, 100)
	c.CollectFromSplit("b", 2, 300)
	if err := w.afterPoll(t0, 2); err != nil {
		t.Fatal(err)
	}
	if err := w.afterPoll(t0.Add(2*time.Second), 0); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(out.wms, []int64{99, 299}) || !slices.Equal(out.idle, []bool{true}) {
		t.Fatalf("watermarks %v, status %v; want 99 then 299 once both are idle, then idle", out.wms, out.idle)
	}
}
