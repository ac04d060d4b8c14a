package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/jobmanager"
	"github.com/weirstream/weir/jobmanager/ha"
)

// failover: how long the exactly-once wordcount's output stops when the
// leading job manager of a highly available cluster is SIGKILLed: two job
// managers (processes of streamctl under `streamctl bench`:
// Config.JobManager) on an etcd run in this process, their checkpoint
// metadata in a shared directory, two task managers of one slot each given
// both job managers, the job at parallelism 2, input arriving throughout.
// It is measured from the kill to the first committed output record that
// counts a line produced after the kill (as recovery measures), and the
// output is then checked record by record. The baseline is the leader's
// lease time-to-live: no standby may lead before the lease of a crashed
// leader expires, so the ratio is the failover's cost over that floor.

// failoverLeaseTTL is the lease of the benchmark's job managers.
const failoverLeaseTTL = 3 * time.Second

// HAJobManager says how a job manager of the failover benchmark joins its
// cluster.
type HAJobManager struct {
	Endpoints []string      // etcd
	Cluster   string        // --ha-cluster-id
	Storage   string        // --checkpoint-storage
	LeaseTTL  time.Duration // --ha-lease-ttl
}

// JobManager is a job manager the failover benchmark started.
type JobManager struct {
	// Addr is its control-plane address.
	Addr string
	// Kill ends it at once, without any cleanup (SIGKILL for a process),
	// and returns once it is gone; Stop stops it cleanly.
	Kill, Stop func()
}

// StartJobManager starts a highly available job manager registering
// JobTypes.
type StartJobManager func(ctx context.Context, h HAJobManager) (JobManager, error)

// inProcessJobManager is the StartJobManager of tests: a job manager in
// this process. Its Kill closes its etcd connection first (so it cannot
// resign) and then stops it: not a SIGKILL, but the standby still waits for
// the lease to expire.
func inProcessJobManager(ctx context.Context, h HAJobManager) (JobManager, error) {
	reg, err := Registry()
	if err != nil {
		return JobManager{}, err
	}
	svc, err := ha.New(ctx, h.Endpoints, h.Cluster, ha.LeaseTTL(h.LeaseTTL))
	if err != nil {
		return JobManager{}, err
	}
	st, err := storage.Open(ctx, h.Storage)
	if err != nil {
		svc.Close()
		return JobManager{}, err
	}
	srv, err := jobmanager.New(jobmanager.Jobs(reg), jobmanager.HighAvailability(svc, st))
	if err != nil {
		svc.Close()
		st.Close()
		return JobManager{}, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		svc.Close()
		st.Close()
		srv.Close()
		return JobManager{}, err
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sctx, lis) }()
	var once sync.Once
	end := func(crash bool) {
		once.Do(func() {
			if crash {
				svc.Close() // no resignation: the standby waits for the lease
			}
			cancel()
			<-served
			srv.Close()
			st.Close()
			svc.Close()
		})
	}
	return JobManager{Addr: lis.Addr().String(), Kill: func() { end(true) }, Stop: func() { end(false) }}, nil
}

// Failover measures seconds from a leader job manager's SIGKILL to output
// resuming, against the lease time-to-live (3 runs, 1 with Quick).
func Failover(ctx context.Context, cfg Config) ([]Line, error) {
	runs := cfg.runsOf(3, 1)
	kb, err := startBroker(ctx)
	if err != nil {
		return nil, err
	}
	defer kb.Close()
	dir, err := os.MkdirTemp("", "weir-bench-failover-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	etcd, err := ha.StartEmbedded(ctx, dir+"/etcd", ha.FastForTests())
	if err != nil {
		return nil, err
	}
	defer etcd.Close()
	startJM, startTM := cfg.JobManager, cfg.TaskManager
	where := "job-manager and task-manager processes (SIGKILL)"
	if startJM == nil || startTM == nil {
		startJM, startTM, where = inProcessJobManager, inProcessTaskManager, "in-process job and task managers (cut off, not SIGKILLed)"
	}
	var took, ttls []float64
	for i := range runs {
		cfg.progress("run %d/%d", i+1, runs)
		h := HAJobManager{Endpoints: etcd.Endpoints(), Cluster: "bench-" + strconv.Itoa(i), Storage: "file://" + dir + "/checkpoints",
			LeaseTTL: failoverLeaseTTL}
		d, err := failoverRun(ctx, kb, h, startJM, startTM, i)
		if err != nil {
			return nil, fmt.Errorf("run %d: %w", i+1, err)
		}
		took, ttls = append(took, d.Seconds()), append(ttls, failoverLeaseTTL.Seconds())
	}
	l := compared("failover", "seconds_to_resume", "lease-ttl", took, ttls)
	l.Note = fmt.Sprintf("from a SIGKILL of the leading job manager of two (etcd in the bench process, lease %v) to the first committed "+
		"output of input written after it; exactly-once wordcount, parallelism 2, checkpoints every 200 ms, %d lines/s; %s; "+
		"median of %d runs; %s s", failoverLeaseTTL, int(recoveryLines*time.Second/recoveryTick), where, runs, secs(took))
	return []Line{l}, nil
}

func failoverRun(ctx context.Context, kb *kafkaBroker, h HAJobManager, startJM StartJobManager, startTM StartTaskManager, run int) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	in, out := fmt.Sprintf("failover-in-%d", run), fmt.Sprintf("failover-out-%d", run)
	if _, err := kb.adm.CreateTopic(ctx, 4, -1, nil, in); err != nil {
		return 0, err
	}
	first, err := startJM(ctx, h)
	if err != nil {
		return 0, fmt.Errorf("start job manager: %w", err)
	}
	defer first.Stop()
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	err = rpc.WaitLeading(wctx, first.Addr)
	wcancel()
	if err != nil {
		return 0, err
	}
	second, err := startJM(ctx, h)
	if err != nil {
		return 0, fmt.Errorf("start job manager: %w", err)
	}
	defer second.Stop()
	addrs := first.Addr + "," + second.Addr
	for _, id := range []string{"a", "b"} {
		tm, err := startTM(ctx, addrs, fmt.Sprintf("failover-%s-%d", id, run), "")
		if err != nil {
			return 0, fmt.Errorf("start task manager: %w", err)
		}
		defer tm.Stop()
	}
	jms, err := rpc.DialAll(addrs)
	if err != nil {
		return 0, err
	}
	defer jms.Close()
	feed, err := startFeed(ctx, kb.addr, in)
	if err != nil {
		return 0, err
	}
	defer func() { _, _ = feed.stop() }()
	mon, err := watchOutput(ctx, kb.addr, out)
	if err != nil {
		return 0, err
	}
	defer mon.stop()
	req := &weirpb.SubmitJobRequest{JobType: wordcount.Type.Name, Params: map[string]string{"brokers": kb.addr, "input": in, "output": out,
		"group": "failover-" + strconv.Itoa(run), "parallelism": "2"}, CheckpointIntervalMs: 200}
	var id string
	for deadline := time.Now().Add(30 * time.Second); id == ""; {
		_, c, err := jms.Leader(ctx)
		if err != nil {
			return 0, err
		}
		r, err := c.SubmitJob(ctx, req)
		switch {
		case err == nil:
			id = r.JobId
		case status.Code(err) != codes.FailedPrecondition || time.Now().After(deadline): // not enough slots yet
			return 0, fmt.Errorf("submit: %w", err)
		default:
			if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
				return 0, err
			}
		}
	}
	defer func() {
		if _, c, err := jms.Leader(context.WithoutCancel(ctx)); err == nil {
			_, _ = c.CancelJob(context.WithoutCancel(ctx), &weirpb.CancelJobRequest{JobId: id})
		}
	}()

	// Output flowing, steady for a moment, then the kill.
	if _, err := mon.resumedAfter(ctx, feed.after(time.Now())); err != nil {
		return 0, fmt.Errorf("before the kill: %w", err)
	}
	if err := sleepCtx(ctx, 2*time.Second); err != nil {
		return 0, err
	}
	killed := time.Now()
	first.Kill()
	resumed, err := mon.resumedAfter(ctx, feed.after(killed))
	if err != nil {
		return 0, fmt.Errorf("after the kill: %w", err)
	}

	lines, err := feed.stop()
	if err != nil {
		return 0, err
	}
	want := wordcount.Expected(lines)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		rep, err := wordcount.Verify(ctx, []string{kb.addr}, out, want)
		if err == nil && rep.OK() {
			return resumed.Sub(killed), nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = errors.New(rep.String())
			}
			return 0, fmt.Errorf("output %s after the failover: %w", out, err)
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return 0, err
		}
	}
}
