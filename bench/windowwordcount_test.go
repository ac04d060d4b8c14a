package bench

import (
	"maps"
	"strings"
	"testing"
)

// The window wordcount job emits, on --quick-sized input, exactly the
// counts of the hand-written loop: every word of every 1 s window once,
// with its count, and nothing else; and the loop's counts are those of the
// definition (each line's words counted in the window of its timestamp).
func TestWindowWordcountEmitsTheLoopsCountsRecordByRecord(t *testing.T) {
	corpus := windowCorpus(150_000)
	def := map[wordWindow]int64{}
	for _, l := range corpus {
		for _, w := range strings.Fields(strings.ToLower(l.Line)) {
			def[wordWindow{w, l.TS - l.TS%windowSize.Milliseconds()}]++
		}
	}
	_, want := baselineWindowWordcount(corpus)
	if !maps.Equal(want, def) {
		t.Fatalf("the loop counted %d word-windows, the definition %d, or their counts differ", len(want), len(def))
	}
	_, got, err := weirWindowWordcount(t.Context(), corpus)
	if err != nil {
		t.Fatal(err)
	}
	if err := sameWindowCounts(got, want); err != nil {
		t.Fatal(err)
	}
}

// The state size is measured from a checkpoint that holds every
// word-window of the corpus: at least the accumulator's 8 bytes a
// word-window.
func TestWindowStateSizeHoldsEveryWordWindow(t *testing.T) {
	corpus := windowCorpus(5_000)
	_, want := baselineWindowWordcount(corpus)
	size, err := windowStateSize(t.Context(), corpus)
	if err != nil {
		t.Fatal(err)
	}
	if per := float64(size) / float64(len(want)); per < 8 {
		t.Fatalf("%d bytes for %d word-windows: %.1f a word-window, fewer than an accumulator's 8", size, len(want), per)
	}
	t.Logf("%d bytes for %d word-windows", size, len(want))
}

// The collecting sink hands its subtask's counts over when it closes
// without copying them (the loop appends each count once and copies
// nothing while timed): the slice collected is the one written, and all
// joins the subtasks' slices after the run.
func TestCollectingSinkHandsItsCountsOverWithoutCopying(t *testing.T) {
	c := &collected{}
	sinks := []*collectingSink{{all: c}, {all: c}}
	for i, s := range sinks {
		for n := range 3 {
			if err := s.Write(t.Context(), windowCount{wordWindow{"w", int64(i)}, int64(n)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	first := &sinks[0].counts[0]
	for _, s := range sinks {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if len(c.parts) != 2 || &c.parts[0][0] != first {
		t.Fatalf("the first sink's counts were copied when it closed (%d parts)", len(c.parts))
	}
	if got := c.all(); len(got) != 6 {
		t.Fatalf("%d counts collected, want 6", len(got))
	}
}
