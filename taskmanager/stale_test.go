package taskmanager_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/taskmanager"
)

// snapSource never ends and records every checkpoint it snapshots (its
// pre-commit point).
type snapSource struct{ snaps *snapLog }

type snapLog struct {
	mu  sync.Mutex
	ids []checkpoint.ID
}

func (l *snapLog) add(id checkpoint.ID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ids = append(l.ids, id)
}

func (l *snapLog) has(id checkpoint.ID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Contains(l.ids, id)
}

func (snapSource) Open(context.Context, *runtime.OperatorContext) error { return nil }
func (snapSource) Poll(ctx context.Context, _ runtime.Collector[int]) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(5 * time.Millisecond):
		return nil
	}
}
func (s snapSource) Snapshot(_ context.Context, id checkpoint.ID) (runtime.OperatorState, error) {
	s.snaps.add(id)
	return runtime.OperatorState{}, nil
}
func (snapSource) Close() error { return nil }

// staleJM runs attempt 1 of job "snap" on the task manager, checkpoint 1
// included, then falls silent for longer than the heartbeat timeout minus
// the heartbeat interval (the job manager may have ended the session by
// then: that is how long a task manager SIGSTOPped for a heartbeat timeout
// finds its job manager silent when it resumes), then sends the Trigger of
// checkpoint 2 it had queued. It reports what the task manager did with it.
type staleJM struct {
	weirpb.UnimplementedJobManagerServer
	tasks, sources []string
	silence        time.Duration
	result         chan string
	once           sync.Once
}

func (f *staleJM) report(r string) {
	select {
	case f.result <- r:
	default:
	}
}

func (f *staleJM) Connect(s grpc.BidiStreamingServer[weirpb.TaskManagerMessage, weirpb.JobManagerMessage]) error {
	if m, err := s.Recv(); err != nil || m.GetRegister() == nil {
		f.report(fmt.Sprintf("no registration: %v %v", m, err))
		return nil
	}
	first := false
	f.once.Do(func() { first = true })
	if !first { // the task manager registered again: its session ended
		f.report("session ended")
		<-s.Context().Done()
		return nil
	}
	// await answers heartbeats until a message that match accepts.
	await := func(match func(*weirpb.TaskManagerMessage) bool) (*weirpb.TaskManagerMessage, error) {
		for {
			m, err := s.Recv()
			if err != nil {
				return nil, err
			}
			if match(m) {
				return m, nil
			}
			if m.GetHeartbeat() != nil {
				if err := s.Send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Heartbeat{Heartbeat: &weirpb.Heartbeat{}}}); err != nil {
					return nil, err
				}
			}
		}
	}
	script := []struct {
		send *weirpb.JobManagerMessage
		want func(*weirpb.TaskManagerMessage) bool
	}{
		{&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Registered{Registered: &weirpb.Registered{
			Session: 1, HeartbeatIntervalMs: 1000, HeartbeatTimeoutMs: 5000}}}, nil},
		{&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Deploy{Deploy: &weirpb.DeployTasks{
			JobId: "job", JobType: "snap", Attempt: 1, TaskIds: f.tasks, DataSecret: secret}}},
			func(m *weirpb.TaskManagerMessage) bool { return m.GetPrepared() != nil }},
		{&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Open{Open: &weirpb.OpenTasks{
			JobId: "job", Attempt: 1, IntervalMs: 1000, TimeoutMs: 60000}}},
			func(m *weirpb.TaskManagerMessage) bool { return m.GetOpened() != nil }},
		{&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Start{Start: &weirpb.StartTasks{JobId: "job", Attempt: 1}}}, nil},
		{&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Trigger{Trigger: &weirpb.TriggerCheckpoint{
			JobId: "job", Attempt: 1, CheckpointId: 1, SourceTaskIds: f.sources}}},
			func(m *weirpb.TaskManagerMessage) bool { return m.GetAck() != nil && m.GetAck().CheckpointId == 1 }},
	}
	for i, step := range script {
		if err := s.Send(step.send); err != nil {
			f.report(fmt.Sprintf("step %d: %v", i, err))
			return nil
		}
		if step.want == nil {
			continue
		}
		m, err := await(step.want)
		if err != nil {
			f.report(fmt.Sprintf("step %d: %v", i, err))
			return nil
		}
		if p := m.GetPrepared(); p != nil && p.Error != "" {
			f.report("not prepared: " + p.Error)
			return nil
		}
		if o := m.GetOpened(); o != nil && o.Error != "" {
			f.report("not opened: " + o.Error)
			return nil
		}
	}
	// Silent: heartbeats go unanswered.
	recv := make(chan *weirpb.TaskManagerMessage, 1024)
	go func() {
		defer close(recv)
		for {
			m, err := s.Recv()
			if err != nil {
				return
			}
			recv <- m
		}
	}()
	time.Sleep(f.silence)
	if err := s.Send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Trigger{Trigger: &weirpb.TriggerCheckpoint{
		JobId: "job", Attempt: 1, CheckpointId: 2, SourceTaskIds: f.sources}}}); err != nil {
		f.report("session ended")
		return nil
	}
	for m := range recv {
		if a := m.GetAck(); a != nil && a.CheckpointId == 2 {
			f.report("acked checkpoint 2")
			return nil
		}
	}
	f.report("session ended")
	return nil
}

// A task manager that finds its job manager silent for so long that the job
// manager may have ended the session (resumed after a SIGSTOP: the job
// manager's messages queued meanwhile arrive at once) ends the session and
// acts on none of them: a queued Trigger pre-committed nothing for an
// attempt the job manager has already failed over (before, it was handled
// first, leaving a transaction open until its timeout and an ack marker
// that made the next attempt park the records).
func TestAResumedTaskManagerActsOnNoMessageOfItsEndedSession(t *testing.T) {
	snaps := &snapLog{}
	reg, tasks := oneSourceJob(t, "snap", func() runtime.Source[int] { return snapSource{snaps} })
	// Silent for 4.5 s: more than the timeout (5 s) minus the interval
	// (1 s), less than the timeout, so the task manager's own watch has not
	// ended the session yet when the Trigger arrives. The job manager's
	// other gaps (its answers to heartbeats) are one interval.
	f := &staleJM{tasks: tasks, sources: tasks[:1], silence: 4500 * time.Millisecond, result: make(chan string, 1)}
	gs, addr := startJM(t, "127.0.0.1:0", f)
	t.Cleanup(gs.Stop)
	r := runScripted(t, addr, f.result, taskmanager.Slots(1), taskmanager.Jobs(reg), taskmanager.ReconnectDelay(10*time.Millisecond))
	if r != "session ended" {
		t.Fatalf("the task manager, after its job manager was silent for %v: %s", f.silence, r)
	}
	if !snaps.has(1) {
		t.Fatal("checkpoint 1, triggered while the session was live, was not snapshotted")
	}
	if snaps.has(2) {
		t.Fatal("the source snapshotted (pre-committed) checkpoint 2 of a session the job manager may have ended")
	}
}
