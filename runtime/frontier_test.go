package runtime

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// fakeFrontier is a SplitFrontier whose readings the test sets.
type fakeFrontier struct {
	version int64
	splits  []Frontier[int64]
	aligned [][]string
}

func (f *fakeFrontier) Frontier() (int64, []Frontier[int64]) { return f.version, f.splits }
func (f *fakeFrontier) AlignSplits(ahead []string)           { f.aligned = append(f.aligned, ahead) }

// A source that gives a frontier emits no watermark before its first
// reading, whatever its records and however long (a restarted share group
// may redeliver older records), and is never marked idle; then its
// watermark is the frontier's, not its own records': a punctuated
// generator's watermarks on its records never go out; the final watermark
// of a bounded input does. A source that gives none (version < 0) follows
// its own records.
func TestAFrontierSourcesWatermarkFollowsTheFrontierNotItsOwnRecords(t *testing.T) {
	got := runFrontierSource(t, 0, func(f *fakeFrontier, step func(time.Duration, ...int64)) {
		step(0, 100, 200)
		step(5*time.Second, 300) // far past the idleness timeout, nothing read yet
		f.version, f.splits = 1, []Frontier[int64]{{Split: "t/0", Pending: true, Records: []FrontierRecord[int64]{{Offset: 7, Value: 150}}}}
		step(6*time.Second, 400)
		step(9 * time.Second) // no records for long: not idle, the frontier is pending
	})
	if want := []string{"wm 150", fmt.Sprint("wm ", MaxWatermark)}; !slices.Equal(got, want) {
		t.Fatalf("emitted %v, want %v", got, want)
	}
	got = runFrontierSource(t, -1, func(f *fakeFrontier, step func(time.Duration, ...int64)) {
		step(0, 100, 200)
		step(2 * time.Second)
	})
	if want := []string{"wm 100", "wm 200", "idle", "active", fmt.Sprint("wm ", MaxWatermark)}; !slices.Equal(got, want) {
		t.Fatalf("without a frontier: emitted %v, want %v", got, want)
	}
}

// runFrontierSource runs a source's watermark machinery with a punctuated
// generator over a fakeFrontier at version (as the source opens): play
// calls step(at, records...) for each Poll; the input then ends. It
// returns what went out.
func runFrontierSource(t *testing.T, version int64, play func(f *fakeFrontier, step func(time.Duration, ...int64))) []string {
	t.Helper()
	punctuated := func() WatermarkGenerator[int64] { return &punctuatedEvery{} }
	ws := ForGenerator(punctuated, WithIdleness(time.Second), WithWatermarkInterval(time.Millisecond),
		WithTimestampAssigner(func(v, _ int64) int64 { return v }))
	w := newSourceWatermarks(&ws)
	f := &fakeFrontier{version: version}
	w.useFrontier(f)
	var got []string
	w.emit = func(e envelope) error {
		switch e.mark {
		case markWatermark:
			got = append(got, fmt.Sprint("wm ", e.wm))
		default:
			got = append(got, e.mark.String())
		}
		return nil
	}
	t0 := time.Unix(1000, 0)
	step := func(at time.Duration, emitted ...int64) {
		t.Helper()
		for _, ts := range emitted {
			w.observe(ts, w.assign(ts, 0))
		}
		if err := w.afterPoll(t0.Add(at), int64(len(emitted))); err != nil {
			t.Fatal(err)
		}
	}
	play(f, step)
	if err := w.end(); err != nil {
		t.Fatal(err)
	}
	return got
}

// punctuatedEvery emits each record's timestamp as a watermark.
type punctuatedEvery struct{}

func (punctuatedEvery) OnEvent(_ int64, ts int64, out WatermarkOutput) { out.EmitWatermark(ts) }
func (punctuatedEvery) OnPeriodicEmit(WatermarkOutput)                 {}
