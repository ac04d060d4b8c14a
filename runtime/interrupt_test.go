package runtime

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// idleSource emits one record, then waits in Poll for nothing but the
// task's interrupt (or the end of the job), as a source waiting for data
// that does not come.
type idleSource struct {
	oc      *OperatorContext
	emitted bool
	woken   *atomic.Int64
}

func (s *idleSource) Open(_ context.Context, oc *OperatorContext) error { s.oc = oc; return nil }
func (s *idleSource) Poll(ctx context.Context, out Collector[int]) error {
	if !s.emitted {
		s.emitted = true
		out.Collect(1)
	}
	select {
	case <-s.oc.Interrupt():
		s.woken.Add(1)
	case <-ctx.Done():
	}
	return nil
}
func (s *idleSource) Snapshot(context.Context, checkpoint.ID) (OperatorState, error) {
	return OperatorState{}, nil
}
func (s *idleSource) Close() error { return nil }

// A source's Poll that waits for data is woken by the barriers and
// notifications sent to its task (OperatorContext.Interrupt), so
// checkpoints complete although Poll never returns on its own.
func TestPollWaitingForDataIsInterruptedByCheckpointControl(t *testing.T) {
	var woken atomic.Int64
	j := NewJob("interrupt")
	SinkTo(FromSource(j, "idle", func() Source[int] { return &idleSource{woken: &woken} }), "out",
		func() Sink[int] { return canceledSink{new(atomic.Int64)} })
	// The deadline only ends a run that hangs; the assertion is below.
	ctx, cancel := context.WithTimeoutCause(t.Context(), time.Minute, errors.New("no checkpoint completed"))
	defer cancel()
	var completed atomic.Int64
	mc := NewMiniCluster(CheckpointInterval(20*time.Millisecond), OnCheckpointComplete(func(e CheckpointEvent) {
		completed.Store(int64(e.ID))
		if e.ID >= 3 {
			cancel()
		}
	}))
	_, _ = mc.Run(ctx, j)
	if completed.Load() < 3 {
		t.Fatalf("%d checkpoints completed with a source waiting in Poll; want 3 (woken %d times)", completed.Load(), woken.Load())
	}
	if woken.Load() < 3 {
		t.Fatalf("Poll was interrupted %d times for 3 checkpoints' triggers and notifications", woken.Load())
	}
}

// Outside a deployment an operator context's interrupt never fires.
func TestInterruptOutsideADeploymentNeverFires(t *testing.T) {
	var oc *OperatorContext
	for _, c := range []*OperatorContext{oc, {}} {
		select {
		case <-c.Interrupt():
			t.Fatal("the interrupt of an operator context outside a deployment fired")
		default:
		}
	}
}
