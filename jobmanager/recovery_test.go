package jobmanager_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/jobmanager"
)

// connectTM opens a task manager session of id (one slot) with the job
// manager at addr; end ends it without a goodbye, as a killed process's
// closed connection does. It heartbeats every 100 ms until silence is
// called (a paused process keeps its connection and falls silent).
func connectTM(t *testing.T, addr, id string) (msgs <-chan *weirpb.JobManagerMessage, silence, end func()) {
	t.Helper()
	cc, err := rpc.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	st, err := weirpb.NewJobManagerClient(cc).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Register{Register: &weirpb.Register{
		TaskManagerId: id, Slots: 1, DataHost: "127.0.0.1"}}}); err != nil {
		t.Fatal(err)
	}
	quiet := make(chan struct{})
	go func() {
		for {
			select {
			case <-quiet:
				return
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			if st.Send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Heartbeat{Heartbeat: &weirpb.Heartbeat{
				SentUnixMs: time.Now().UnixMilli()}}}) != nil {
				return
			}
		}
	}()
	return pump(t, st), func() { close(quiet) }, cancel
}

// waitRecovery waits (30 s) until job id's first restart is being timed.
func waitRecovery(t *testing.T, s *jobmanager.Server, id string) jobmanager.Recovery {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		if rs := s.Recoveries(id); len(rs) > 0 {
			return rs[0]
		}
		if time.Now().After(deadline) {
			r, _, err := s.Job(t.Context(), id)
			t.Fatalf("no restart of job %s 30s after the failure: %+v %v", id, r, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A task manager whose connection ends without a goodbye (a SIGKILLed
// process: the kernel closes its sockets) fails its tasks over at once: the
// restart is triggered by the connection's loss, never by the heartbeat
// timeout (an hour here), and it is timed from the loss.
func TestARestartAfterAConnectionEndsIsDetectedByTheLossNotTheHeartbeatTimeout(t *testing.T) {
	s, err := jobmanager.New(jobmanager.Jobs(numbersRegistry(t)), jobmanager.HeartbeatTimeout(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	addr, _ := serve(t, s)
	msgs, _, end := connectTM(t, addr, "tm-1")
	waitFor(t, s, "registered task manager", func(tms []jobmanager.TaskManager) bool { return len(tms) == 1 })
	id, err := s.Submit(t.Context(), "numbers", nil, time.Second, "fixed-delay:attempts=3,delay=1h")
	if err != nil {
		t.Fatal(err)
	}
	await(t, msgs, "the deployment", isDeploy)
	lost := time.Now()
	end()
	r := waitRecovery(t, s, id)
	if r.Detection != jobmanager.DetectedConnectionLoss || !strings.Contains(r.Cause, "connection ended without a goodbye") {
		t.Errorf("restart detected by %q (%s), want %q", r.Detection, r.Cause, jobmanager.DetectedConnectionLoss)
	}
	// The delay (1h) counts from the failure, not from the end of the
	// cancel.
	if r.Failed.Before(lost) || r.Failed.After(r.Canceled) || r.NextAttempt.Before(r.Failed.Add(time.Hour)) || r.NextAttempt.After(r.Canceled.Add(time.Hour)) {
		t.Errorf("failed at %v, cancelled %v, next attempt %v: want the loss (after %v) first, the delay counted from it",
			r.Failed, r.Canceled, r.NextAttempt, lost)
	}
}

// A task manager that falls silent with its connection open (paused,
// hung) is detected by the heartbeat timeout, and the restart says so.
func TestARestartAfterATaskManagerFellSilentIsDetectedByTheHeartbeatTimeout(t *testing.T) {
	s, err := jobmanager.New(jobmanager.Jobs(numbersRegistry(t)), jobmanager.HeartbeatInterval(100*time.Millisecond),
		jobmanager.HeartbeatTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	addr, _ := serve(t, s)
	msgs, silence, _ := connectTM(t, addr, "tm-1")
	waitFor(t, s, "registered task manager", func(tms []jobmanager.TaskManager) bool { return len(tms) == 1 })
	id, err := s.Submit(t.Context(), "numbers", nil, time.Second, "fixed-delay:attempts=3,delay=1h")
	if err != nil {
		t.Fatal(err)
	}
	await(t, msgs, "the deployment", isDeploy)
	silence()
	if r := waitRecovery(t, s, id); r.Detection != jobmanager.DetectedHeartbeatTimeout {
		t.Errorf("restart detected by %q (%s), want %q", r.Detection, r.Cause, jobmanager.DetectedHeartbeatTimeout)
	}
}

// A recovery's steps follow each other from the failure to the first
// checkpoint; the cancel and the restart delay both count from the
// failure.
func TestARecoveryIsSplitIntoItsSteps(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	r := jobmanager.Recovery{Detection: jobmanager.DetectedConnectionLoss, Failed: at(0), Canceled: at(1100), NextAttempt: at(1000),
		Restarted: at(1110), Slots: at(1120), Deployed: at(1150), Opened: at(1250), FirstRecord: at(1400), Checkpoint: at(1600)}
	want := "connection loss; cancel 1.1s, restart delay 1s, restart 1.11s, slot wait 10ms, deploy 30ms, restore 100ms, " +
		"source re-open 150ms, first checkpoint 200ms"
	if got := r.String(); got != want || !r.Done() {
		t.Errorf("%s (done %v), want %s", got, r.Done(), want)
	}
	r.Checkpoint, r.FirstRecord = time.Time{}, time.Time{}
	if got, want := r.String(), "connection loss; cancel 1.1s, restart delay 1s, restart 1.11s, slot wait 10ms, deploy 30ms, restore 100ms"; got != want || r.Done() {
		t.Errorf("in progress: %s (done %v), want %s", got, r.Done(), want)
	}
}
