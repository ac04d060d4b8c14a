package runtime

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// switchHold is a WatermarkHolder whose answer the test sets.
type switchHold struct{ on bool }

func (h *switchHold) HoldWatermark(time.Time) bool { return h.on }

// A source that holds its watermark (WatermarkHolder) emits none, on an
// event or periodically, and is never marked idle while the hold lasts; its
// generator still sees every record, so the first watermark after the hold
// covers them; the idleness clock starts again when the hold ends; the
// final watermark of a bounded input goes out even while held.
func TestAHeldSourceEmitsNoWatermarkAndIsNeverIdleUntilTheHoldEnds(t *testing.T) {
	ws := ForBoundedOutOfOrderness[int](10*time.Millisecond, WithIdleness(time.Second),
		WithWatermarkInterval(time.Millisecond))
	w := newSourceWatermarks(&ws)
	h := &switchHold{on: true}
	w.holder = h
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
		now := t0.Add(at)
		w.hold(now)
		for _, ts := range emitted {
			w.observe(0, w.assign(0, ts))
		}
		if err := w.afterPoll(now, int64(len(emitted))); err != nil {
			t.Fatal(err)
		}
	}
	step(0, 100, 200)
	step(10*time.Millisecond, 300)
	step(5 * time.Second) // far past the idleness timeout, but held
	if len(got) != 0 {
		t.Fatalf("while held: %v, want nothing", got)
	}
	h.on = false
	step(5*time.Second + time.Millisecond)
	step(5*time.Second + 500*time.Millisecond) // idle clock restarted at the end of the hold
	step(6*time.Second + 2*time.Millisecond)
	h.on = true
	step(7*time.Second, 400)
	if err := w.end(); err != nil {
		t.Fatal(err)
	}
	want := []string{"wm 289", "idle", "active", fmt.Sprint("wm ", MaxWatermark)}
	if !slices.Equal(got, want) {
		t.Fatalf("emitted %v, want %v", got, want)
	}
}
