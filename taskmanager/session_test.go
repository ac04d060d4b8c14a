package taskmanager_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/taskmanager"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeJM registers every task manager and heartbeats back.
type fakeJM struct {
	weirpb.UnimplementedJobManagerServer
	regs chan string
}

func (f *fakeJM) Connect(s grpc.BidiStreamingServer[weirpb.TaskManagerMessage, weirpb.JobManagerMessage]) error {
	for {
		m, err := s.Recv()
		if err != nil {
			return nil
		}
		if r := m.GetRegister(); r != nil {
			f.regs <- r.TaskManagerId
			err = s.Send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Registered{Registered: &weirpb.Registered{
				Session: 1, HeartbeatIntervalMs: 50, HeartbeatTimeoutMs: 500}}})
		} else {
			err = s.Send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Heartbeat{Heartbeat: &weirpb.Heartbeat{}}})
		}
		if err != nil {
			return err
		}
	}
}

func startJM(t *testing.T, addr string, f weirpb.JobManagerServer) (*grpc.Server, string) {
	t.Helper()
	var lis net.Listener
	var err error
	for i := 0; i < 50; i++ { // the port of a stopped server may take a moment to free
		if lis, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	weirpb.RegisterJobManagerServer(gs, f)
	go func() { _ = gs.Serve(lis) }()
	return gs, lis.Addr().String()
}

// A task manager registers, and registers again by itself when the job
// manager is restarted on the same address.
func TestTaskManagerReconnectsToARestartedJobManager(t *testing.T) {
	f := &fakeJM{regs: make(chan string, 10)}
	gs, jmAddr := startJM(t, "127.0.0.1:0", f)
	t.Cleanup(gs.Stop)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- taskmanager.Run(ctx, jmAddr, taskmanager.ID("tm-a"), taskmanager.Slots(2),
			taskmanager.ReconnectDelay(50*time.Millisecond))
	}()
	expect := func(what string) {
		t.Helper()
		select {
		case id := <-f.regs:
			if id != "tm-a" {
				t.Fatalf("%s: registered %q", what, id)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no registration after 5s", what)
		}
	}
	expect("first registration")
	gs.Stop()
	gs2, _ := startJM(t, jmAddr, f)
	t.Cleanup(gs2.Stop)
	expect("registration after the job manager restarted")
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v, want context.Canceled", err)
	}
}

// Slots below one are refused before anything is dialed.
func TestTaskManagerRefusesZeroSlots(t *testing.T) {
	if err := taskmanager.Run(t.Context(), "127.0.0.1:1", taskmanager.Slots(0)); err == nil {
		t.Fatal("Run with 0 slots succeeded")
	}
}
