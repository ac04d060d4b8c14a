package taskmanager_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/taskmanager"
)

// lateSource emits nothing for its first polls after the start (a source
// joining its group), then one record per poll.
type lateSource struct{ quiet time.Duration }

func (lateSource) Open(context.Context, *runtime.OperatorContext) error { return nil }

func (s *lateSource) Poll(ctx context.Context, out runtime.Collector[int]) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(s.quiet):
	}
	s.quiet = 5 * time.Millisecond
	out.Collect(1)
	return nil
}

func (lateSource) Snapshot(context.Context, checkpoint.ID) (runtime.OperatorState, error) {
	return runtime.OperatorState{}, nil
}
func (lateSource) Close() error { return nil }

// firstRecord is what a openingJM does after the open: it starts the
// tasks once opened, and reports the first heartbeat that tells when the
// source task had its first record after the start.
func firstRecord(s grpc.BidiStreamingServer[weirpb.TaskManagerMessage, weirpb.JobManagerMessage], m *weirpb.TaskManagerMessage) (string, error) {
	if o := m.GetOpened(); o != nil {
		if o.Error != "" {
			return "not opened: " + o.Error, nil
		}
		return "", s.Send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Start{Start: &weirpb.StartTasks{JobId: "job", Attempt: 1}}})
	}
	for _, c := range m.GetHeartbeat().GetCounts() {
		for _, tc := range c.Tasks {
			if tc.Source && tc.FirstRecordUs > 0 {
				return fmt.Sprintf("first record after %dus", tc.FirstRecordUs), nil
			}
		}
	}
	return "", nil
}

// A task manager's heartbeats say how long after the start of an attempt's
// tasks each source task emitted its first record (the job manager times a
// recovery's source re-open with it): here a source quiet for its first
// 300 ms.
func TestHeartbeatsTellWhenASourceHadItsFirstRecordAfterTheStart(t *testing.T) {
	const quiet = 300 * time.Millisecond
	reg, tasks := oneSourceJob(t, "late", func() runtime.Source[int] { return &lateSource{quiet: quiet} })
	f := &openingJM{jobType: "late", heartbeatMs: 50, tasks: tasks, result: make(chan string, 1), then: firstRecord,
		open: &weirpb.OpenTasks{JobId: "job", Attempt: 1, IntervalMs: 60000, TimeoutMs: 60000}}
	gs, addr := startJM(t, "127.0.0.1:0", f)
	t.Cleanup(gs.Stop)
	r := runScripted(t, addr, f.result, taskmanager.Slots(1), taskmanager.Jobs(reg), taskmanager.ReconnectDelay(time.Hour))
	var us int64
	if _, err := fmt.Sscanf(r, "first record after %dus", &us); err != nil {
		t.Fatalf("%s; want a heartbeat with the source's first record", r)
	}
	after := time.Duration(us) * time.Microsecond
	if after < quiet {
		t.Errorf("the source's first record %v after the start, want at least its quiet %v", after, quiet)
	}
}
