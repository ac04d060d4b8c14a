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

// stuckSource's Open blocks until release is closed (or the deployment is
// cancelled): a deployment busy with one command.
type stuckSource struct{ release <-chan struct{} }

func (s stuckSource) Open(ctx context.Context, _ *runtime.OperatorContext) error {
	select {
	case <-s.release:
	case <-ctx.Done():
	}
	return nil
}
func (stuckSource) Poll(context.Context, runtime.Collector[int]) error { return runtime.ErrEndOfInput }
func (stuckSource) Snapshot(context.Context, checkpoint.ID) (runtime.OperatorState, error) {
	return runtime.OperatorState{}, nil
}
func (stuckSource) Close() error { return nil }

type dropSink struct{}

func (dropSink) Open(context.Context, *runtime.OperatorContext) error { return nil }
func (dropSink) Write(context.Context, int) error                     { return nil }
func (dropSink) Snapshot(context.Context, checkpoint.ID) (runtime.OperatorState, error) {
	return runtime.OperatorState{}, nil
}
func (dropSink) Close() error { return nil }

// floodJM deploys attempt 1 of a job whose Open blocks, sends Open and then
// more commands than a deployment queues, then deploys attempt 2 and
// reports whether the task manager answered it (it read on) or the session
// ended (its receive loop stopped, heartbeats went unread, the session
// dropped).
type floodJM struct {
	weirpb.UnimplementedJobManagerServer
	tasks    []string
	commands int
	result   chan string
}

func (f *floodJM) Connect(s grpc.BidiStreamingServer[weirpb.TaskManagerMessage, weirpb.JobManagerMessage]) error {
	// prepared waits for Prepared of attempt; heartbeats are answered.
	prepared := func(attempt int32) error {
		for {
			m, err := s.Recv()
			if err != nil {
				return err
			}
			if p := m.GetPrepared(); p != nil && p.Attempt == attempt {
				if p.Error != "" {
					return fmt.Errorf("attempt %d: %s", attempt, p.Error)
				}
				return nil
			}
			if m.GetHeartbeat() != nil {
				if err := s.Send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Heartbeat{Heartbeat: &weirpb.Heartbeat{}}}); err != nil {
					return err
				}
			}
		}
	}
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
	send := func(m *weirpb.JobManagerMessage) error { return s.Send(m) }
	deploy := func(attempt int32) *weirpb.JobManagerMessage {
		return &weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Deploy{Deploy: &weirpb.DeployTasks{
			JobId: "job", JobType: "stuck", Attempt: attempt, TaskIds: f.tasks, DataSecret: secret}}}
	}
	if err := send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Registered{Registered: &weirpb.Registered{
		Session: 1, HeartbeatIntervalMs: 50, HeartbeatTimeoutMs: 2000}}}); err != nil {
		return err
	}
	if err := send(deploy(1)); err != nil {
		return err
	}
	if err := prepared(1); err != nil {
		return report("attempt 1 not prepared: " + err.Error())
	}
	if err := send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Open{Open: &weirpb.OpenTasks{
		JobId: "job", Attempt: 1, IntervalMs: 1000, TimeoutMs: 60000}}}); err != nil {
		return err
	}
	for i := range f.commands {
		if err := send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Notify{Notify: &weirpb.NotifyCheckpoint{
			JobId: "job", Attempt: 1, CheckpointId: uint64(i + 1), Complete: false}}}); err != nil {
			return err
		}
	}
	if err := send(deploy(2)); err != nil {
		return err
	}
	if err := prepared(2); err != nil {
		return report("session ended before attempt 2 was prepared: " + err.Error())
	}
	report("ok")
	<-s.Context().Done()
	return nil
}

// A deployment busy with a command (here an Open that does not return)
// while the job manager sends it more commands than it has room for must
// not stop the task manager's receive loop: it reads on, so heartbeats are
// seen and other deployments are served, and the session stays up.
func TestABusyDeploymentDoesNotStopTheSessionsReceiveLoop(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	reg, tasks := oneSourceJob(t, "stuck", func() runtime.Source[int] { return stuckSource{release} })
	f := &floodJM{tasks: tasks, commands: 1000, result: make(chan string, 1)}
	gs, addr := startJM(t, "127.0.0.1:0", f)
	t.Cleanup(gs.Stop)
	if r := runScripted(t, addr, f.result, taskmanager.Slots(2), taskmanager.Jobs(reg), taskmanager.ReconnectDelay(time.Hour)); r != "ok" {
		t.Fatal(r)
	}
}

// oneSourceJob registers job type name (source src into a sink that drops
// everything) in a new registry, and returns it with the tasks of the job's
// one slot share at parallelism 1, for a scripted job manager to deploy.
func oneSourceJob(t *testing.T, name string, src func() runtime.Source[int]) (*runtime.Registry, []string) {
	t.Helper()
	build := func(runtime.Params) (*runtime.Job, error) {
		j := runtime.NewJob(name)
		runtime.SinkTo(runtime.FromSource(j, "src", src), "sink", func() runtime.Sink[int] { return dropSink{} })
		return j, nil
	}
	reg := runtime.NewRegistry()
	if err := reg.Register(runtime.JobType{Name: name, Build: build}); err != nil {
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
	return reg, tasks
}

// runScripted runs task manager tm-a against the scripted job manager at
// addr until the script reports its result (at most 60 s), and returns it;
// the task manager is stopped before it returns.
func runScripted(t *testing.T, addr string, result <-chan string, opts ...taskmanager.Opt) string {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- taskmanager.Run(ctx, addr, append([]taskmanager.Opt{taskmanager.ID("tm-a")}, opts...)...)
	}()
	defer func() {
		cancel()
		<-done
	}()
	select {
	case r := <-result:
		return r
	case <-time.After(60 * time.Second):
		t.Fatal("the job manager script did not finish in 60s")
		return ""
	}
}
