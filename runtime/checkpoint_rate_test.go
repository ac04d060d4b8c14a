package runtime

import (
	"context"
	"errors"
	"testing"
	"time"
)

// askingSource asks for a checkpoint on every Poll, as a share-group
// source with a backlog does.
type askingSource struct {
	Source[seqRec]
	oc *OperatorContext
}

func (s *askingSource) Open(ctx context.Context, oc *OperatorContext) error {
	s.oc = oc
	return s.Source.Open(ctx, oc)
}

func (s *askingSource) Poll(ctx context.Context, out Collector[seqRec]) error {
	s.oc.RequestCheckpoint("test: asking all the time")
	return s.Source.Poll(ctx, out)
}

// With the default minimum pause (the interval), a source asking for a
// checkpoint on every Poll gets at most one per interval: at every
// completion, the number completed so far is at most elapsed/interval + 1
// (a count; a slow machine only lowers it).
func TestRequestedCheckpointsKeepToTheIntervalByDefault(t *testing.T) {
	const interval, want = 100 * time.Millisecond, 8
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	src := func() Source[seqRec] {
		return &askingSource{Source: seqSourceOf(seqSource{keys: 4, splits: 1, n: 1 << 30, perPoll: 1, pollDelay: time.Millisecond})()}
	}
	start := time.Now()
	var completions []time.Duration
	_, err := NewMiniCluster(CheckpointInterval(interval), OnCheckpointComplete(func(CheckpointEvent) {
		if completions = append(completions, time.Since(start)); len(completions) == want {
			cancel()
		}
	})).Run(ctx, seqJobTo(src, &violations{}, func() Sink[seqRec] { return discardSink[seqRec]{} }, 1, 1))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("run: %v, want it cancelled after %d checkpoints", err, want)
	}
	for i, at := range completions {
		if bound := int(at/interval) + 1; i+1 > bound {
			t.Fatalf("%d checkpoints completed %v after the start with interval %v (at most %d): requests ran past the interval; completions at %v",
				i+1, at, interval, bound, completions)
		}
	}
}
