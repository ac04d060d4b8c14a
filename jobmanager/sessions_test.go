package jobmanager_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/jobmanager"
	"github.com/weirstream/weir/runtime"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// etcd's embedded server and client (the HA tests) keep
		// package-level goroutines (its log and the gRPC resolver) beyond
		// Close.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
	)
}

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
	// A timeout ten heartbeats long, so that a loaded machine's scheduling
	// stalls do not make the heartbeating task manager look silent.
	const timeout = time.Second
	s, err := jobmanager.New(jobmanager.HeartbeatInterval(100*time.Millisecond), jobmanager.HeartbeatTimeout(timeout))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() }) // after serve's stop: cleanups run last-in first-out
	addr, _ := serve(t, s)
	st := register(t, addr, "tm-1", 2)
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
	// Silent: dropped (waitFor allows 5 s, five timeouts).
	waitFor(t, s, "loss of the silent task manager", func(tms []jobmanager.TaskManager) bool { return len(tms) == 0 })
}

// serve serves s on a new local port until the test ends; stop stops it
// earlier.
func serve(t *testing.T, s *jobmanager.Server) (addr string, stop func()) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, lis) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-served; err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(stop)
	return lis.Addr().String(), stop
}

// register opens a task manager session with the job manager at addr and
// sends its Register; the session ends with the test.
func register(t *testing.T, addr, id string, slots int32) grpc.BidiStreamingClient[weirpb.TaskManagerMessage, weirpb.JobManagerMessage] {
	t.Helper()
	cc, err := rpc.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(func() {
		cancel()
		cc.Close()
	})
	st, err := weirpb.NewJobManagerClient(cc).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Register{Register: &weirpb.Register{
		TaskManagerId: id, Slots: slots, DataHost: "127.0.0.1"}}}); err != nil {
		t.Fatal(err)
	}
	return st
}

// numbersRegistry registers job type "numbers": three ints into a discarding
// sink, at parallelism 1.
func numbersRegistry(t *testing.T) *runtime.Registry {
	t.Helper()
	reg := runtime.NewRegistry()
	if err := reg.Register(runtime.JobType{Name: "numbers", Build: func(runtime.Params) (*runtime.Job, error) {
		job := runtime.NewJob("numbers", runtime.DefaultParallelism(1))
		nums := runtime.FromSource(job, "numbers", runtime.SliceSource([]int{1, 2, 3}, 0))
		runtime.SinkTo(nums, "discard", runtime.SinkFunc(func(context.Context, int) error { return nil }))
		return job, nil
	}}); err != nil {
		t.Fatal(err)
	}
	return reg
}

// resumedJobWaitingForSlots has a job manager accept a job (a task manager
// offers a slot) and stop; a second one on the same data directory resumes
// it with no task manager, so the job waits for slots. hook sees every log
// entry of the second; it returns once the job waits, with the second job
// manager, its address and the job's id.
func resumedJobWaitingForSlots(t *testing.T, hook func(zapcore.Entry)) (*jobmanager.Server, string, string) {
	t.Helper()
	reg := numbersRegistry(t)
	dir := t.TempDir()
	first, err := jobmanager.New(jobmanager.Jobs(reg), jobmanager.DataDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	addr, stop := serve(t, first)
	register(t, addr, "tm-1", 1)
	waitFor(t, first, "registered task manager", func(tms []jobmanager.TaskManager) bool { return len(tms) == 1 })
	id, err := first.Submit(t.Context(), "numbers", nil, time.Second, "")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	waiting := make(chan struct{})
	var once sync.Once
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zap.DebugLevel),
		zap.Hooks(func(e zapcore.Entry) error {
			if e.Message == "waiting for task manager slots" {
				once.Do(func() { close(waiting) })
			}
			hook(e)
			return nil
		}))
	second, err := jobmanager.New(jobmanager.Jobs(reg), jobmanager.DataDir(dir), jobmanager.Logger(log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Close() }) // after serve's stop: cleanups run last-in first-out
	addr, _ = serve(t, second)
	select {
	case <-waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the resumed job did not wait for slots within 10s")
	}
	return second, addr, id
}

// A job waiting for slots (here: resumed by a restarted job manager) is
// deployed onto a task manager the moment it registers, but the task
// manager's first message is still Registered: a Deploy ahead of it makes
// the task manager drop the session as a broken registration, and the job
// waited for ever for an answer from a session nobody read. A slow log sink
// stretches the registration.
func TestARegisteringTaskManagerHearsRegisteredBeforeADeployment(t *testing.T) {
	_, addr, _ := resumedJobWaitingForSlots(t, func(e zapcore.Entry) {
		if e.Message == "task manager registered" {
			time.Sleep(300 * time.Millisecond)
		}
	})
	msgs := pump(t, register(t, addr, "tm-2", 1))
	if first := await(t, msgs, "a first message", isAny); first.GetRegistered() == nil {
		t.Fatalf("the task manager's first message is %v, want Registered", first)
	}
	if got := await(t, msgs, "a deployment", isDeploy).GetDeploy().JobType; got != "numbers" {
		t.Fatalf("deployed job type %q, want numbers", got)
	}
}

// A job waiting for slots is cancelled at once, not after the slot timeout.
func TestCancelDoesNotWaitForSlots(t *testing.T) {
	s, _, id := resumedJobWaitingForSlots(t, func(zapcore.Entry) {})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // the slot timeout is 60s
	defer cancel()
	rec, err := s.Cancel(ctx, id)
	if err != nil {
		t.Fatalf("cancel of a job waiting for slots: %v", err)
	}
	if rec.State != jobmanager.StateCanceled {
		t.Fatalf("job state %s after the cancel, want %s", rec.State, jobmanager.StateCanceled)
	}
}

// A task manager that cannot build its share of an attempt (here: answers
// the deployment with an error, as a failed restore commit does) has no
// tasks for it and sends no DeploymentEnded: the attempt fails at once and
// the restart strategy deploys the next one.
func TestAFailedDeploymentIsRestarted(t *testing.T) {
	reg := numbersRegistry(t)
	// Silence is never what ends the session here.
	s, err := jobmanager.New(jobmanager.Jobs(reg), jobmanager.HeartbeatTimeout(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() }) // after serve's stop: cleanups run last-in first-out
	addr, _ := serve(t, s)
	st := register(t, addr, "tm-1", 1)
	waitFor(t, s, "registered task manager", func(tms []jobmanager.TaskManager) bool { return len(tms) == 1 })
	if _, err := s.Submit(t.Context(), "numbers", nil, time.Second, "fixed-delay:attempts=3,delay=10ms"); err != nil {
		t.Fatal(err)
	}
	msgs := pump(t, st)
	d := await(t, msgs, "a deployment", isDeploy).GetDeploy()
	if d.Attempt != 0 {
		t.Fatalf("first deployment of attempt %d, want 0", d.Attempt)
	}
	if err := st.Send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Prepared{Prepared: &weirpb.Prepared{
		JobId: d.JobId, Attempt: d.Attempt, Error: "restore commit failed"}}}); err != nil {
		t.Fatal(err)
	}
	if d := await(t, msgs, "a second deployment", isDeploy).GetDeploy(); d.Attempt != 1 {
		t.Fatalf("deployment after the failed one of attempt %d, want 1", d.Attempt)
	}
}

// A job cancelled while a task manager prepares its tasks: the cancel
// reaches the task manager at once (CancelTasks), which answers the
// deployment with an error as its cancelled build does, and the job ends
// CANCELED without waiting for anything else.
func TestCancelReachesADeploymentBeingPrepared(t *testing.T) {
	s, err := jobmanager.New(jobmanager.Jobs(numbersRegistry(t)), jobmanager.HeartbeatTimeout(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() }) // after serve's stop: cleanups run last-in first-out
	addr, _ := serve(t, s)
	st := register(t, addr, "tm-1", 1)
	waitFor(t, s, "registered task manager", func(tms []jobmanager.TaskManager) bool { return len(tms) == 1 })
	id, err := s.Submit(t.Context(), "numbers", nil, time.Second, "")
	if err != nil {
		t.Fatal(err)
	}
	msgs := pump(t, st)
	deploy := await(t, msgs, "a deployment", isDeploy).GetDeploy()
	// Prepared is not answered: the task manager is still building.
	canceled := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		rec, err := s.Cancel(ctx, id)
		if err == nil && rec.State != jobmanager.StateCanceled {
			err = fmt.Errorf("job state %s after the cancel, want %s", rec.State, jobmanager.StateCanceled)
		}
		canceled <- err
	}()
	await(t, msgs, "CancelTasks", func(m *weirpb.JobManagerMessage) bool {
		c := m.GetCancel()
		return c != nil && c.JobId == deploy.JobId && c.Attempt == deploy.Attempt
	})
	if err := st.Send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Prepared{Prepared: &weirpb.Prepared{
		JobId: deploy.JobId, Attempt: deploy.Attempt, Error: "context canceled"}}}); err != nil {
		t.Fatal(err)
	}
	if err := <-canceled; err != nil {
		t.Fatalf("cancel of a job whose tasks were being prepared: %v", err)
	}
}

// pump delivers the job manager's messages on session st until it ends
// (then the channel is closed) or the test does.
func pump(t *testing.T, st grpc.BidiStreamingClient[weirpb.TaskManagerMessage, weirpb.JobManagerMessage]) <-chan *weirpb.JobManagerMessage {
	msgs := make(chan *weirpb.JobManagerMessage)
	go func() {
		defer close(msgs)
		for {
			m, err := st.Recv()
			if err != nil {
				return
			}
			select {
			case msgs <- m:
			case <-t.Context().Done():
				return
			}
		}
	}()
	return msgs
}

// await returns the next message of msgs that match accepts, skipping the
// others; it fails the test if the session ends first or none comes within
// 10s.
func await(t *testing.T, msgs <-chan *weirpb.JobManagerMessage, what string, match func(*weirpb.JobManagerMessage) bool) *weirpb.JobManagerMessage {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				t.Fatalf("the session ended before %s", what)
			}
			if match(m) {
				return m
			}
		case <-timeout:
			t.Fatalf("%s did not come within 10s", what)
		}
	}
}

func isAny(*weirpb.JobManagerMessage) bool      { return true }
func isDeploy(m *weirpb.JobManagerMessage) bool { return m.GetDeploy() != nil }

// The restart budget a job manager gives its tasks (the time their
// transactions must outlive after a failure) counts every term of a
// failover on the cluster: the heartbeat timeout that detects a hung task
// manager, the slot wait of the next attempt, the restart strategy's
// largest delay and the restore. Before, it counted only the last two, so
// a transaction timeout shorter than a failover passed the check and the
// broker aborted pre-committed transactions the restore had to commit.
func TestTheRestartBudgetCountsEveryTermOfAClusterFailover(t *testing.T) {
	const recovery = time.Minute // the checkpoint timeout, runtime's default
	for _, tc := range []struct {
		name            string
		heartbeat, slot time.Duration
		strategy        string
		wantDelay       time.Duration
	}{
		{"defaults", 0, 0, "", time.Minute},
		{"fixed delay", 5 * time.Second, 30 * time.Second, "fixed-delay:attempts=3,delay=2s", 2 * time.Second},
		{"exponential delay up to its max backoff", 10 * time.Second, 2 * time.Minute,
			"exponential-delay:initial-backoff=1s,max-backoff=5m", 5 * time.Minute},
		{"failure rate", time.Second, time.Second, "failure-rate:max-failures=2,interval=1m,delay=7s", 7 * time.Second},
		{"none", time.Second, 20 * time.Second, "none", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := []jobmanager.Opt{jobmanager.Jobs(numbersRegistry(t))}
			wantDetection, wantSlot := rpc.DefaultHeartbeatTimeout, jobmanager.DefaultSlotTimeout
			if tc.heartbeat > 0 {
				opts = append(opts, jobmanager.HeartbeatTimeout(tc.heartbeat))
				wantDetection = tc.heartbeat
			}
			if tc.slot > 0 {
				opts = append(opts, jobmanager.SlotTimeout(tc.slot))
				wantSlot = tc.slot
			}
			s, err := jobmanager.New(opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() }) // after serve's stop: cleanups run last-in first-out
			addr, _ := serve(t, s)
			st := register(t, addr, "tm-1", 1)
			waitFor(t, s, "registered task manager", func(tms []jobmanager.TaskManager) bool { return len(tms) == 1 })
			if _, err := s.Submit(t.Context(), "numbers", nil, time.Second, tc.strategy); err != nil {
				t.Fatal(err)
			}
			msgs := pump(t, st)
			send := heartbeat(t, st, wantDetection/4)
			d := await(t, msgs, "a deployment", isDeploy).GetDeploy()
			if err := send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Prepared{Prepared: &weirpb.Prepared{
				JobId: d.JobId, Attempt: d.Attempt, DataAddress: "127.0.0.1:1"}}}); err != nil {
				t.Fatal(err)
			}
			o := await(t, msgs, "OpenTasks", func(m *weirpb.JobManagerMessage) bool { return m.GetOpen() != nil }).GetOpen()
			ms := func(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
			want := wantDetection + wantSlot + tc.wantDelay + recovery
			if got := ms(o.RestartBudgetMs); got != want {
				t.Errorf("restart budget %v, want heartbeat timeout %v + slot wait %v + largest restart delay %v + recovery %v = %v",
					got, wantDetection, wantSlot, tc.wantDelay, recovery, want)
			}
			if ms(o.DetectionMs) != wantDetection || ms(o.SlotWaitMs) != wantSlot || ms(o.RestartDelayMs) != tc.wantDelay ||
				ms(o.RecoveryMs) != recovery {
				t.Errorf("budget terms: detection %v, slot wait %v, restart delay %v, recovery %v; want %v, %v, %v, %v",
					ms(o.DetectionMs), ms(o.SlotWaitMs), ms(o.RestartDelayMs), ms(o.RecoveryMs),
					wantDetection, wantSlot, tc.wantDelay, recovery)
			}
		})
	}
}

// heartbeat sends heartbeats on st every period until the test ends, and
// returns the function to send other messages on st with (a stream's Send
// is not safe for concurrent use).
func heartbeat(t *testing.T, st grpc.BidiStreamingClient[weirpb.TaskManagerMessage, weirpb.JobManagerMessage], period time.Duration) func(*weirpb.TaskManagerMessage) error {
	var mu sync.Mutex
	send := func(m *weirpb.TaskManagerMessage) error {
		mu.Lock()
		defer mu.Unlock()
		return st.Send(m)
	}
	done := make(chan struct{})
	t.Cleanup(func() { <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-t.Context().Done():
				return
			case <-tick.C:
				if send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Heartbeat{Heartbeat: &weirpb.Heartbeat{}}}) != nil {
					return
				}
			}
		}
	}()
	return send
}

// A task manager whose connection ends without warning (a SIGKILLed process:
// the kernel closes its socket; or a network cut) is logged as what it is,
// not as the job manager's own "context canceled".
func TestALostTaskManagerConnectionIsLoggedAsSuch(t *testing.T) {
	for _, tc := range []struct {
		name string
		cut  func(cc *grpc.ClientConn, raw net.Conn)
	}{
		{"socket closed under the client", func(_ *grpc.ClientConn, raw net.Conn) { raw.Close() }},
		{"client connection closed", func(cc *grpc.ClientConn, _ net.Conn) { cc.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.WarnLevel)
			s, err := jobmanager.New(jobmanager.Logger(zap.New(core)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			addr, _ := serve(t, s)
			conns := make(chan net.Conn, 1)
			cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
					c, err := (&net.Dialer{}).DialContext(ctx, "tcp", a)
					if err == nil {
						select {
						case conns <- c:
						default:
						}
					}
					return c, err
				}))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cc.Close() })
			st, err := weirpb.NewJobManagerClient(cc).Connect(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Register{Register: &weirpb.Register{
				TaskManagerId: "tm-1", Slots: 1, DataHost: "127.0.0.1"}}}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, s, "registered task manager", func(tms []jobmanager.TaskManager) bool { return len(tms) == 1 })
			tc.cut(cc, <-conns)
			waitFor(t, s, "loss of the task manager", func(tms []jobmanager.TaskManager) bool { return len(tms) == 0 })
			lost := logs.FilterMessage("task manager lost").All()
			if len(lost) != 1 {
				t.Fatalf("%d \"task manager lost\" entries, want 1: %v", len(lost), logs.All())
			}
			msg := fmt.Sprint(lost[0].ContextMap()["error"])
			if !strings.Contains(msg, "connection ended without a goodbye (process exited or network lost)") ||
				strings.Contains(msg, "connection closed: context canceled") {
				t.Fatalf("task manager lost with error %q: does not say the connection ended", msg)
			}
		})
	}
}
