package jobmanager_test

import (
	"context"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/jobmanager"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func waitFor(t *testing.T, s *jobmanager.Server, what string, ok func([]jobmanager.TaskManager) bool) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ch := s.Changed()
		if tms := s.TaskManagers(); ok(tms) {
			return time.Since(start)
		}
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("no %s after 5s: %v", what, s.TaskManagers())
		}
	}
}

// A task manager registers and stays while it heartbeats; once it falls
// silent (a hung or SIGSTOPped process: the connection stays open) the job
// manager drops it within the heartbeat timeout.
func TestSilentTaskManagerIsDroppedWithinTheTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	s, err := jobmanager.New(jobmanager.HeartbeatInterval(50*time.Millisecond), jobmanager.HeartbeatTimeout(timeout))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, lis) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()
	cc, err := rpc.Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	st, err := weirpb.NewJobManagerClient(cc).Connect(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Register{Register: &weirpb.Register{
		TaskManagerId: "tm-1", Slots: 2, DataHost: "127.0.0.1"}}}); err != nil {
		t.Fatal(err)
	}
	m, err := st.Recv()
	if err != nil || m.GetRegistered() == nil || m.GetRegistered().HeartbeatTimeoutMs != timeout.Milliseconds() {
		t.Fatalf("registration answered %v, %v", m, err)
	}
	waitFor(t, s, "registered task manager", func(tms []jobmanager.TaskManager) bool {
		return len(tms) == 1 && tms[0].ID == "tm-1" && tms[0].Slots == 2
	})
	// Heartbeat for three timeouts: still there; the job manager heartbeats too.
	got := 0
	for end := time.Now().Add(3 * timeout); time.Now().Before(end); {
		if err := st.Send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Heartbeat{Heartbeat: &weirpb.Heartbeat{}}}); err != nil {
			t.Fatal(err)
		}
		if m, err := st.Recv(); err == nil && m.GetHeartbeat() != nil {
			got++
		}
	}
	if n := len(s.TaskManagers()); n != 1 || got == 0 {
		t.Fatalf("after heartbeating: %d task managers, %d heartbeats from the job manager", n, got)
	}
	// Silent: dropped.
	silentFrom := time.Now()
	waitFor(t, s, "loss of the silent task manager", func(tms []jobmanager.TaskManager) bool { return len(tms) == 0 })
	if d := time.Since(silentFrom); d > 3*timeout {
		t.Fatalf("silent task manager dropped after %v, timeout %v", d, timeout)
	}
	scancel()
}
