package taskmanager_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/taskmanager"
)

// haJM is a job manager of a highly available cluster as a task manager
// sees it: it says whether it leads (Leader) and registers with its
// leadership's fencing token on every message.
type haJM struct {
	fakeJM
	token   int64
	leading atomic.Bool
	leader  atomic.Value // string: the leader's address, when not leading
}

func (j *haJM) Leader(context.Context, *weirpb.LeaderRequest) (*weirpb.LeaderInfo, error) {
	addr, _ := j.leader.Load().(string)
	return &weirpb.LeaderInfo{Leading: j.leading.Load(), LeaderAddress: addr, Token: j.token}, nil
}

func (j *haJM) Connect(s grpc.BidiStreamingServer[weirpb.TaskManagerMessage, weirpb.JobManagerMessage]) error {
	for {
		m, err := s.Recv()
		if err != nil {
			return nil
		}
		out := &weirpb.JobManagerMessage{LeaderToken: j.token, Msg: &weirpb.JobManagerMessage_Heartbeat{Heartbeat: &weirpb.Heartbeat{}}}
		if r := m.GetRegister(); r != nil {
			j.regs <- r.TaskManagerId
			out.Msg = &weirpb.JobManagerMessage_Registered{Registered: &weirpb.Registered{
				Session: uint64(j.token), HeartbeatIntervalMs: 50, HeartbeatTimeoutMs: 500}}
		}
		if err := s.Send(out); err != nil {
			return err
		}
	}
}

// A task manager given several job managers registers with the one that
// leads (a standby points it there), and after a failover refuses a
// deposed leader that still claims to lead (its token is below the one it
// has seen): it registers only with leaders of equal or higher tokens.
func TestTaskManagerFindsTheLeaderAndRefusesADeposedOne(t *testing.T) {
	deposed := &haJM{fakeJM: fakeJM{regs: make(chan string, 100)}, token: 5}
	leader := &haJM{fakeJM: fakeJM{regs: make(chan string, 100)}, token: 9}
	gsA, addrA := startJM(t, "127.0.0.1:0", deposed)
	t.Cleanup(gsA.Stop)
	gsB, addrB := startJM(t, "127.0.0.1:0", leader)
	t.Cleanup(gsB.Stop)
	leader.leading.Store(true)
	deposed.leader.Store(addrB)

	sessions := make(chan uint64, 100)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- taskmanager.Run(ctx, addrA+","+addrB, taskmanager.ID("tm-a"), taskmanager.Slots(2),
			taskmanager.ReconnectDelay(20*time.Millisecond), taskmanager.OnRegistered(func(s uint64) { sessions <- s }))
	}()
	next := func(what string) uint64 {
		t.Helper()
		select {
		case s := <-sessions:
			return s
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no registration after 10s", what)
		}
		return 0
	}
	if s := next("first registration"); s != 9 {
		t.Fatalf("registered with the job manager of token %d, want the leader's (9)", s)
	}
	if len(deposed.regs) != 0 {
		t.Fatal("the task manager registered with the standby")
	}

	// The leader goes away; the old one claims to lead again, unaware it
	// was deposed.
	gsB.Stop()
	deposed.leading.Store(true)
	select {
	case <-deposed.regs:
	case <-time.After(10 * time.Second):
		t.Fatal("the task manager never tried the job manager claiming to lead")
	}
	select {
	case s := <-sessions:
		t.Fatalf("registered with the deposed leader (token %d)", s)
	case <-time.After(300 * time.Millisecond): // several refused attempts
	}

	// A new leader at the old leader's address: registered again.
	newLeader := &haJM{fakeJM: fakeJM{regs: make(chan string, 100)}, token: 12}
	newLeader.leading.Store(true)
	deposed.leading.Store(false)
	deposed.leader.Store(addrB)
	gsC, _ := startJM(t, addrB, newLeader)
	t.Cleanup(gsC.Stop)
	if s := next("registration with the new leader"); s != 12 {
		t.Fatalf("registered with the job manager of token %d, want the new leader's (12)", s)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v, want context.Canceled", err)
	}
}
