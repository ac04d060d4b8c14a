package runtime

import (
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/weirstream/weir/checkpoint"
)

// A job's info log carries no line per checkpoint: every completion is at
// debug level, and info holds a summary whose counts add up to every
// checkpoint the run completed.
func TestCheckpointCompletionsAreSummarisedAtInfo(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	var completed []checkpoint.ID
	res, err := NewMiniCluster(CheckpointInterval(5*time.Millisecond), Logger(zap.New(core)),
		OnCheckpointComplete(func(e CheckpointEvent) { completed = append(completed, e.ID) })).
		Run(t.Context(), seqJob(seqSourceOf(seqSource{keys: 4, splits: 2, n: 200, perPoll: 1, pollDelay: time.Millisecond}),
			&violations{}, newMemTxns(), nil, 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	if len(completed) < 2 {
		t.Fatalf("%d checkpoints completed: too few to tell", len(completed))
	}
	debug := map[uint64]int{}
	summed := int64(0)
	for _, e := range logs.All() {
		fields := e.ContextMap()
		switch {
		case e.Message == "checkpoint completed" && e.Level == zapcore.DebugLevel:
			debug[fields["checkpoint"].(uint64)]++
		case e.Message == "checkpoints completed" && e.Level == zapcore.InfoLevel:
			summed += fields["completed"].(int64)
			if got := fields["last_checkpoint"].(uint64); got != uint64(res.LastCheckpoint) && summed == int64(len(completed)) {
				t.Errorf("last summary names checkpoint %d as the last, want %d", got, res.LastCheckpoint)
			}
		case e.Level >= zapcore.InfoLevel && (e.Message == "checkpoint completed"):
			t.Fatalf("checkpoint completion logged at %v: %v", e.Level, fields)
		}
	}
	for _, id := range completed {
		if debug[uint64(id)] != 1 {
			t.Errorf("checkpoint %d logged %d times at debug, want once", id, debug[uint64(id)])
		}
	}
	if summed != int64(len(completed)) {
		t.Fatalf("info summaries count %d completions, the run completed %d", summed, len(completed))
	}
}

// The summary comes once per window, at the first completion past it, and
// the rest at flush: counts, last id and durations per window.
func TestCheckpointSummaryWindows(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := newCheckpointSummary(zap.New(core), "job", time.Minute, t0)
	for i := 1; i <= 150; i++ { // one per second, 100ms each, the 75th slow
		d := 100 * time.Millisecond
		if i == 75 {
			d = time.Second
		}
		s.completed(t0.Add(time.Duration(i)*time.Second), checkpoint.ID(i), d, int64(i))
	}
	s.flush(t0.Add(151 * time.Second))
	s.flush(t0.Add(152 * time.Second)) // nothing completed since: no line
	type line struct {
		completed int64
		last      uint64
		max       time.Duration
	}
	want := []line{{60, 60, 100 * time.Millisecond}, {60, 120, time.Second}, {30, 150, 100 * time.Millisecond}}
	var got []line
	for _, e := range logs.All() {
		f := e.ContextMap()
		got = append(got, line{f["completed"].(int64), f["last_checkpoint"].(uint64), f["duration_max"].(time.Duration)})
	}
	if len(got) != len(want) {
		t.Fatalf("summaries %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("summaries %+v, want %+v", got, want)
		}
	}
}
