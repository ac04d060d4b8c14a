package rpc_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/internal/rpc/weirpb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeJM answers a Register with Registered and echoes heartbeats until
// mute is set, then reads without answering (a hung job manager).
type fakeJM struct {
	weirpb.UnimplementedJobManagerServer
	mute atomic.Bool
}

func (f *fakeJM) Connect(s grpc.BidiStreamingServer[weirpb.TaskManagerMessage, weirpb.JobManagerMessage]) error {
	for {
		m, err := s.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if f.mute.Load() {
			continue
		}
		switch m.Msg.(type) {
		case *weirpb.TaskManagerMessage_Register:
			err = s.Send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Registered{Registered: &weirpb.Registered{
				Session: 1, HeartbeatIntervalMs: 20, HeartbeatTimeoutMs: 200}}})
		case *weirpb.TaskManagerMessage_Heartbeat:
			err = s.Send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Heartbeat{Heartbeat: &weirpb.Heartbeat{}}})
		}
		if err != nil {
			return err
		}
	}
}

func serve(t *testing.T, srv weirpb.JobManagerServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	weirpb.RegisterJobManagerServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

// A session registers, heartbeats both ways, and the task-manager side
// detects a job manager that stops answering within the timeout.
func TestSessionHeartbeatsAndDetectsASilentPeer(t *testing.T) {
	jm := &fakeJM{}
	cc, err := rpc.Dial(serve(t, jm))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st, err := weirpb.NewJobManagerClient(cc).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Register{Register: &weirpb.Register{
		TaskManagerId: "tm-1", Slots: 2, DataHost: "127.0.0.1"}}}); err != nil {
		t.Fatal(err)
	}
	first, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	reg := first.GetRegistered()
	if reg == nil || reg.Session != 1 {
		t.Fatalf("first message %v, want Registered with session 1", first)
	}
	live := rpc.NewLiveness()
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		for {
			if _, err := st.Recv(); err != nil {
				return
			}
			live.Seen()
		}
	}()
	sendDone := make(chan error, 1)
	go func() {
		sendDone <- rpc.Every(ctx, time.Duration(reg.HeartbeatIntervalMs)*time.Millisecond, func() error {
			return st.Send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Heartbeat{Heartbeat: &weirpb.Heartbeat{}}})
		})
	}()
	timeout := time.Duration(reg.HeartbeatTimeoutMs) * time.Millisecond
	// Alive while the peer answers.
	wctx, wcancel := context.WithTimeout(ctx, 3*timeout)
	if err := live.Watch(wctx, timeout); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Watch on a live peer: %v, want the watch to outlast it", err)
	}
	wcancel()
	jm.mute.Store(true)
	start := time.Now()
	if err := live.Watch(ctx, timeout); !errors.Is(err, rpc.ErrPeerDead) {
		t.Fatalf("Watch on a silent peer: %v, want ErrPeerDead", err)
	}
	if d := time.Since(start); d > 3*timeout {
		t.Fatalf("a silent peer was noticed after %v, timeout %v", d, timeout)
	}
	cancel()
	<-recvDone
	if err := <-sendDone; err != nil && !errors.Is(err, context.Canceled) && status.Code(err) != codes.Canceled && !errors.Is(err, io.EOF) {
		t.Fatalf("heartbeat sender: %v", err)
	}
}

// A call to an address nobody listens at fails; Dial refuses an empty one.
func TestDialUnreachable(t *testing.T) {
	if _, err := rpc.Dial(""); !errors.Is(err, rpc.ErrUnreachable) {
		t.Fatalf("Dial(\"\"): %v, want ErrUnreachable", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	cc, err := rpc.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if _, err := weirpb.NewJobManagerClient(cc).ListJobs(ctx, &weirpb.ListJobsRequest{}); status.Code(err) != codes.Unavailable && status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("ListJobs to a closed port: %v, want Unavailable", err)
	}
}

// A silent peer is declared dead as soon as its silence passes the
// timeout, not at the next of four checks per timeout: heard from 100 ms
// into the watch, it is dead 3 s later, not up to 750 ms after that (in
// synctest's virtual time, so the machine's load cannot move it).
func TestASilentPeerIsDeclaredDeadWhenItsSilencePassesTheTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 3 * time.Second
		live := rpc.NewLiveness()
		start := time.Now()
		go func() {
			time.Sleep(100 * time.Millisecond)
			live.Seen()
		}()
		err := live.Watch(t.Context(), timeout)
		if !errors.Is(err, rpc.ErrPeerDead) {
			t.Fatalf("Watch on a silent peer: %v, want ErrPeerDead", err)
		}
		if took, want := time.Since(start), 100*time.Millisecond+timeout+time.Millisecond; took != want {
			t.Errorf("declared dead %v after the watch began (%v): want %v, as soon as its silence passed the timeout %v", took, err, want, timeout)
		}
	})
}
