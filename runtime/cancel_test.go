package runtime

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// tickSource emits 1, 2, 3, ... one per poll, until cancelled.
type tickSource struct{ n int }

func (s *tickSource) Open(context.Context, *OperatorContext) error { return nil }
func (s *tickSource) Poll(ctx context.Context, out Collector[int]) error {
	s.n++
	out.Collect(s.n)
	select {
	case <-time.After(time.Millisecond):
	case <-ctx.Done():
	}
	return nil
}
func (s *tickSource) Snapshot(context.Context, checkpoint.ID) (OperatorState, error) {
	return OperatorState{}, nil
}
func (s *tickSource) Close() error { return nil }

// canceledSink records the lastCompleted of NotifyJobCanceled.
type canceledSink struct{ got *atomic.Int64 }

func (s canceledSink) Open(context.Context, *OperatorContext) error { return nil }
func (s canceledSink) Write(context.Context, int) error             { return nil }
func (s canceledSink) Snapshot(context.Context, checkpoint.ID) (OperatorState, error) {
	return OperatorState{}, nil
}
func (s canceledSink) Close() error { return nil }
func (s canceledSink) NotifyJobCanceled(_ context.Context, last checkpoint.ID) error {
	s.got.Store(int64(last))
	return nil
}

// queuedNotifies plays a task manager whose completion notifications are
// still queued when the cancel overtakes them: it swallows every Notify,
// and on a cancel passes the newest completed id on with NoteCompleted,
// as the task manager does with CancelTasks.last_completed.
type queuedNotifies struct {
	job       *Job
	mu        sync.Mutex
	completed checkpoint.ID
}

type queuedDeployment struct {
	*localDeployment
	q *queuedNotifies
}

func (q *queuedNotifies) Deploy(ctx context.Context, spec DeploySpec, rep TaskReports) (Deployed, error) {
	// As on a task manager, only Cancel stops the tasks: a deployment
	// under the job's context would see the cancel before Cancel noted
	// the completed checkpoint.
	d, err := Deploy(context.WithoutCancel(ctx), q.job, spec, nil, rep)
	if err != nil {
		return nil, err
	}
	return queuedDeployment{d.(*localDeployment), q}, nil
}

func (d queuedDeployment) Notify(_ context.Context, id checkpoint.ID, complete bool) {
	d.q.mu.Lock()
	defer d.q.mu.Unlock()
	if complete && id > d.q.completed {
		d.q.completed = id
	}
}

func (d queuedDeployment) Cancel(forGood bool) {
	d.q.mu.Lock()
	last := d.q.completed
	d.q.mu.Unlock()
	d.NoteCompleted(last)
	d.localDeployment.Cancel(forGood)
}

// A cancel for good that overtakes the notification of the last completed
// checkpoint still tells the operators that checkpoint
// (NotifyJobCanceled), so they commit what it covers, as the operators
// that were notified did: otherwise a source would abort the
// acknowledgements of records whose output another task manager's sink
// committed, and they would be processed again.
func TestCancelOvertakingANotificationCommitsTheCompletedCheckpoint(t *testing.T) {
	var got atomic.Int64
	got.Store(-1)
	j := NewJob("cancel")
	SinkTo(FromSource(j, "ticks", func() Source[int] { return &tickSource{} }), "out",
		func() Sink[int] { return canceledSink{&got} })
	q := &queuedNotifies{job: j}
	ctx, cancel := context.WithCancelCause(t.Context())
	var completed atomic.Int64
	mc := NewMiniCluster(Deployment(q), CheckpointInterval(20*time.Millisecond),
		OnCheckpointComplete(func(e CheckpointEvent) {
			completed.Store(int64(e.ID))
			if e.ID >= 3 {
				cancel(ErrJobCanceled)
			}
		}))
	if _, err := mc.Run(ctx, j); err == nil {
		t.Fatal("a cancelled job's Run returned no error")
	}
	if got.Load() < 3 || got.Load() != completed.Load() {
		t.Fatalf("NotifyJobCanceled(%d), want the last completed checkpoint %d (at least 3)", got.Load(), completed.Load())
	}
}
