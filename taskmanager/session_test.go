package taskmanager_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
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

// A task manager whose job manager is unreachable (down, or failing over)
// retries every reconnect delay but warns once, not at every attempt.
func TestAnUnreachableJobManagerIsWarnedOfOnceNotAtEveryAttempt(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	core, logs := observer.New(zapcore.DebugLevel)
	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	err = taskmanager.Run(ctx, dead, taskmanager.ID("tm-a"), taskmanager.Logger(zap.New(core)),
		taskmanager.ReconnectDelay(50*time.Millisecond))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run: %v, want the context's deadline", err)
	}
	attempts := logs.FilterMessage("job manager still unreachable").Len() + 1
	if warns := logs.FilterLevelExact(zapcore.WarnLevel).All(); len(warns) != 1 || attempts < 5 {
		t.Errorf("%d attempts, %d warnings %v; want several attempts and one warning", attempts, len(warns), warns)
	}
}
