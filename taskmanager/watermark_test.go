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

// tenThenHold emits 1..10 and then nothing, without ending.
type tenThenHold struct{ next int }

func (s *tenThenHold) Open(context.Context, *runtime.OperatorContext) error { return nil }
func (s *tenThenHold) Poll(ctx context.Context, out runtime.Collector[int]) error {
	if s.next >= 10 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
			return nil
		}
	}
	s.next++
	out.Collect(s.next)
	return nil
}
func (s *tenThenHold) Snapshot(context.Context, checkpoint.ID) (runtime.OperatorState, error) {
	return runtime.OperatorState{}, nil
}
func (s *tenThenHold) Close() error { return nil }

// watermarkJM deploys and opens a job, then reports the first input
// watermark a heartbeat carries for its source task that is past the
// first watermark.
type watermarkJM struct {
	weirpb.UnimplementedJobManagerServer
	tasks  []string
	result chan string
}

func (f *watermarkJM) Connect(s grpc.BidiStreamingServer[weirpb.TaskManagerMessage, weirpb.JobManagerMessage]) error {
	report := func(r string) error {
		select {
		case f.result <- r:
		default:
		}
		return nil
	}
	if m, err := s.Recv(); err != nil || m.GetRegister() == nil {
		return report(fmt.Sprintf("no registration: %v %v", m, err))
	}
	if err := s.Send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Registered{Registered: &weirpb.Registered{
		Session: 1, HeartbeatIntervalMs: 50, HeartbeatTimeoutMs: 5000}}}); err != nil {
		return err
	}
	if err := s.Send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Deploy{Deploy: &weirpb.DeployTasks{
		JobId: "job", JobType: "wm", Attempt: 1, TaskIds: f.tasks, DataSecret: secret}}}); err != nil {
		return err
	}
	var last string
	for beats := 0; ; {
		m, err := s.Recv()
		if err != nil {
			return report("session ended: " + err.Error())
		}
		if p := m.GetPrepared(); p != nil {
			if p.Error != "" {
				return report("not prepared: " + p.Error)
			}
			if err := s.Send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Open{Open: &weirpb.OpenTasks{
				JobId: "job", Attempt: 1, IntervalMs: 60000, TimeoutMs: 60000}}}); err != nil {
				return err
			}
		}
		if o := m.GetOpened(); o != nil {
			if err := s.Send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Start{Start: &weirpb.StartTasks{JobId: "job", Attempt: 1}}}); err != nil {
				return err
			}
		}
		hb := m.GetHeartbeat()
		if hb == nil {
			continue
		}
		if err := s.Send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Heartbeat{Heartbeat: &weirpb.Heartbeat{}}}); err != nil {
			return err
		}
		if beats++; beats > 400 {
			return report("no heartbeat carried the watermark 9999; the last: " + last)
		}
		last = fmt.Sprint(hb.Counts)
		for _, dc := range hb.Counts {
			for _, tc := range dc.Tasks {
				if tc.Source && tc.InputWatermark == 9_999 && tc.OutputWatermark == 9_999 {
					return report("ok")
				}
			}
		}
	}
}

// A task's input and output watermarks (currentInputWatermark,
// currentOutputWatermark) reach the job manager in the task manager's
// heartbeats: a source with monotonous timestamps 1 s .. 10 s reports 10 s
// - 1 ms.
func TestHeartbeatsCarryEachTasksWatermarks(t *testing.T) {
	build := func(runtime.Params) (*runtime.Job, error) {
		j := runtime.NewJob("wm")
		ws := runtime.ForMonotonousTimestamps[int](runtime.WithTimestampAssigner(func(v int, _ int64) int64 { return int64(v) * 1000 }),
			runtime.WithWatermarkInterval(time.Millisecond))
		src := runtime.FromSource(j, "src", func() runtime.Source[int] { return &tenThenHold{} }, runtime.Watermarks(ws))
		runtime.SinkTo(src, "sink", func() runtime.Sink[int] { return dropSink{} })
		return j, nil
	}
	reg := runtime.NewRegistry()
	if err := reg.Register(runtime.JobType{Name: "wm", Build: build}); err != nil {
		t.Fatal(err)
	}
	job, _ := build(nil)
	shares, _, err := runtime.SlotShares(job, 1)
	if err != nil {
		t.Fatal(err)
	}
	var tasks []string
	for _, id := range shares[0] {
		tasks = append(tasks, string(id))
	}
	f := &watermarkJM{tasks: tasks, result: make(chan string, 1)}
	gs, addr := startJM(t, "127.0.0.1:0", f)
	t.Cleanup(gs.Stop)
	if r := runScripted(t, addr, f.result, taskmanager.Jobs(reg), taskmanager.ReconnectDelay(time.Hour)); r != "ok" {
		t.Fatal(r)
	}
}
