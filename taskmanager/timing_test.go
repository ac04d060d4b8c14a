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

// timingSource records the checkpoint timing its Open is given.
type timingSource struct {
	snapSource
	got chan<- checkpoint.Timing
}

func (s timingSource) Open(_ context.Context, oc *runtime.OperatorContext) error {
	s.got <- oc.Checkpointing
	return nil
}

// openingJM deploys attempt 1 of job jobType and opens it with open once
// its tasks are prepared; every later message of the task manager goes to
// then, which returns a result to report (and ends the script) or "".
type openingJM struct {
	weirpb.UnimplementedJobManagerServer
	jobType     string
	heartbeatMs int64
	tasks       []string
	open        *weirpb.OpenTasks
	then        func(s grpc.BidiStreamingServer[weirpb.TaskManagerMessage, weirpb.JobManagerMessage], m *weirpb.TaskManagerMessage) (string, error)
	result      chan string
}

func (f *openingJM) Connect(s grpc.BidiStreamingServer[weirpb.TaskManagerMessage, weirpb.JobManagerMessage]) error {
	report := func(r string) error {
		select {
		case f.result <- r:
		default:
		}
		<-s.Context().Done()
		return nil
	}
	if m, err := s.Recv(); err != nil || m.GetRegister() == nil {
		return report(fmt.Sprintf("no registration: %v %v", m, err))
	}
	for _, m := range []*weirpb.JobManagerMessage{
		{Msg: &weirpb.JobManagerMessage_Registered{Registered: &weirpb.Registered{Session: 1, HeartbeatIntervalMs: f.heartbeatMs, HeartbeatTimeoutMs: 30000}}},
		{Msg: &weirpb.JobManagerMessage_Deploy{Deploy: &weirpb.DeployTasks{JobId: "job", JobType: f.jobType, Attempt: 1, TaskIds: f.tasks, DataSecret: secret}}},
	} {
		if err := s.Send(m); err != nil {
			return err
		}
	}
	for {
		m, err := s.Recv()
		if err != nil {
			return report(err.Error())
		}
		if p := m.GetPrepared(); p != nil {
			if p.Error != "" {
				return report("not prepared: " + p.Error)
			}
			if err := s.Send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Open{Open: f.open}}); err != nil {
				return err
			}
			continue
		}
		r, err := f.then(s, m)
		if err != nil {
			return err
		}
		if r != "" {
			return report(r)
		}
	}
}

// The checkpoint timing a task manager hands its operators is the one the
// job manager sent, the restart budget's failover terms included (a
// transactional operator names them when it refuses its timeout).
func TestOperatorsOnATaskManagerLearnTheRestartBudgetsTerms(t *testing.T) {
	got := make(chan checkpoint.Timing, 1)
	reg, tasks := oneSourceJob(t, "timing", func() runtime.Source[int] { return timingSource{snapSource{&snapLog{}}, got} })
	f := &openingJM{jobType: "timing", heartbeatMs: 500, tasks: tasks, result: make(chan string, 1), open: &weirpb.OpenTasks{JobId: "job", Attempt: 1,
		IntervalMs: 1000, TimeoutMs: 60000, MinPauseMs: 10, TolerableFailures: 3, RestartBudgetMs: 183000,
		DetectionMs: 3000, SlotWaitMs: 60000, RestartDelayMs: 60000, RecoveryMs: 60000},
		then: func(_ grpc.BidiStreamingServer[weirpb.TaskManagerMessage, weirpb.JobManagerMessage], m *weirpb.TaskManagerMessage) (string, error) {
			if o := m.GetOpened(); o != nil {
				return "opened " + o.Error, nil
			}
			return "", nil
		}}
	gs, addr := startJM(t, "127.0.0.1:0", f)
	t.Cleanup(gs.Stop)
	if r := runScripted(t, addr, f.result, taskmanager.Slots(1), taskmanager.Jobs(reg), taskmanager.ReconnectDelay(time.Hour)); r != "opened " {
		t.Fatal(r)
	}
	want := checkpoint.Timing{Interval: time.Second, Timeout: time.Minute, MinPause: 10 * time.Millisecond, TolerableFailures: 3,
		RestartBudget: 183 * time.Second, Failover: checkpoint.Failover{Detection: 3 * time.Second, SlotWait: time.Minute,
			RestartDelay: time.Minute, Recovery: time.Minute}}
	if g := <-got; g != want {
		t.Fatalf("the operator's checkpoint timing is %+v, want %+v", g, want)
	}
}
