package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/weirstream/weir/bench"
	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/taskmanager"
)

func newBenchCmd(a *app) *cobra.Command {
	var cfg bench.Config
	var only []string
	cmd := &cobra.Command{
		Use:   "bench [--quick] [--only NAME]...",
		Short: "Run Weir's benchmarks; print one JSON line per result",
		Long: `bench runs every benchmark against a hand-written baseline on the same data in
the same process run, and prints one JSON object per result on stdout:
  {"bench":..,"metric":..,"value":..,"baseline":..,"baseline_value":..,"ratio":..,
   "runs":..,"ratio_min":..,"ratio_max":..,"value_min":..,"value_max":..}
A comparison alternates the two sides (Weir, baseline, Weir, baseline, ...):
value and baseline_value are each side's median, ratio the median of the
per-run ratios, ratio_min and ratio_max their spread. --quick keeps the whole
run under a minute (fewer runs, less data). While a benchmark runs, a
progress line goes to stderr (live on a terminal, every few seconds
otherwise).

Benchmarks (--only NAME, repeatable; in run order; runtime-wordcount also
reports limit-runtime-wordcount, window-wordcount also reports
window-state-per-key, eos-wordcount also reports limit-wordcount and
share-inflight, eos-wordcount-kafka reports the wordcount on the partition
source against the share group's (eos-wordcount-kafka) and against a
hand-written partition loop (eos-wordcount-kafka-ceiling), recovery reports seconds from a task-manager SIGKILL to
output resuming against a clean task failure, failover seconds from a
SIGKILL of the leading job manager of two (etcd, lease 3s) to output
resuming against the lease, limits reports limit-produce
and limit-share-consume, nexmark reports nexmark-generator and
nexmark-QUERY-cp10s and -cp1s per query, each in events per CPU-second with
events_per_s (WEIR_NEXMARK_CPUPROFILE=DIR writes a CPU profile of each query
run; with --nexmark-backends it reports nexmark-QUERY-BACKEND instead: every
query run to completion on each backend in a process of its own, with peak RSS
and the largest checkpoint's size, sync, async and total durations), nexmark-topic reports nexmark-topic-q0-kafka: q0 from a topic on the
partition source against the share group, in events per CPU-second):
  ` + strings.Join(bench.Names(), "\n  "),
		Args: cobra.NoArgs,
		RunE: a.withLogger(func(cmd *cobra.Command, log *zap.Logger) error {
			cfg.Progress = a.progress(log).Update
			cfg.TaskManagers = benchTaskManagers
			cfg.TaskManager = benchTaskManager
			cfg.JobManager = benchJobManager
			cfg.NexmarkProcess = benchNexmarkProcess
			return bench.Run(cmd.Context(), a.stdout, cfg, only...)
		}),
	}
	cmd.Flags().BoolVar(&cfg.Quick, "quick", false, "shorter runs (whole bench under 60 s)")
	cmd.Flags().Int64Var(&cfg.NexmarkEvents, "nexmark-events", 0, "events per nexmark run (0: 2000000, 200000 with --quick)")
	cmd.Flags().StringSliceVar(&cfg.NexmarkBackends, "nexmark-backends", nil,
		"run every nexmark query to completion on these state backends (heap,pebble), each in a process of its own, checkpoint every 10s; "+
			"reports nexmark-QUERY-BACKEND with peak RSS and the largest checkpoint (Flink's standard size: --nexmark-events 100000000)")
	cmd.Flags().StringSliceVar(&cfg.NexmarkQueries, "nexmark-queries", nil, "with --nexmark-backends, run only these queries (e.g. q5,q7)")
	cmd.Flags().Var((*byteSize)(&cfg.NexmarkStateMemory), "nexmark-state-memory",
		"with --nexmark-backends, the pebble backend's memory budget in each run, as run --state-memory (default: the RocksDB memory of Flink's published runs, 789MiB a slot, times the parallelism of 2)")
	cmd.Flags().StringSliceVar(&only, "only", nil, "run only these benchmarks (repeatable): "+strings.Join(bench.Names(), ", "))
	return cmd
}

// benchTaskManagerCmd is the hidden command runtime-wordcount-2tm starts
// its task managers with: a task manager that runs the benchmark's job
// types (bench.JobTypes) instead of the registered ones.
func newBenchTaskManagerCmd(a *app) *cobra.Command {
	var jm, id string
	cmd := &cobra.Command{
		Use:    "bench-taskmanager --jobmanager ADDR --id ID",
		Short:  "A task manager for runtime-wordcount-2tm (started by bench)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: a.withLogger(func(cmd *cobra.Command, log *zap.Logger) error {
			reg, err := bench.Registry()
			if err != nil {
				return err
			}
			fp, err := failpoint.FromEnv()
			if err != nil {
				return err
			}
			err = taskmanager.Run(cmd.Context(), jm, taskmanager.ID(id), taskmanager.Slots(1), taskmanager.Logger(log), taskmanager.Jobs(reg),
				taskmanager.Failpoints(fp))
			if errors.Is(err, context.Canceled) && cmd.Context().Err() != nil {
				return nil
			}
			return err
		}),
	}
	cmd.Flags().StringVar(&jm, "jobmanager", "", "job manager address")
	cmd.Flags().StringVar(&id, "id", "bench-tm", "task manager id")
	return cmd
}

// newBenchNexmarkRunCmd is the hidden command nexmark --nexmark-backends
// runs each query in: one run of bench.RunNexmarkQuery, its result as one
// JSON object on stdout.
func newBenchNexmarkRunCmd(a *app) *cobra.Command {
	var spec bench.NexmarkRunSpec
	cmd := &cobra.Command{
		Use:    "bench-nexmark-run --query Q --backend heap|pebble --events N --checkpoint-interval DUR",
		Short:  "One nexmark query run of bench --nexmark-backends (started by bench)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: a.withLogger(func(cmd *cobra.Command, _ *zap.Logger) error {
			r, err := bench.RunNexmarkQuery(cmd.Context(), spec)
			if err != nil {
				return err
			}
			return json.NewEncoder(a.stdout).Encode(r)
		}),
	}
	cmd.Flags().StringVar(&spec.Query, "query", "", "the query")
	cmd.Flags().StringVar(&spec.Backend, "backend", "heap", "the state backend")
	cmd.Flags().Int64Var(&spec.Events, "events", 0, "events to generate")
	cmd.Flags().DurationVar(&spec.Interval, "checkpoint-interval", 10*time.Second, "checkpoint interval")
	cmd.Flags().Var((*byteSize)(&spec.StateMemory), "state-memory", "the pebble backend's memory budget (default: as run's)")
	return cmd
}

// benchNexmarkProcess runs spec in a bench-nexmark-run process of this
// binary and returns its result, with the larger of the peak RSS it
// reported and its rusage maxrss.
func benchNexmarkProcess(ctx context.Context, spec bench.NexmarkRunSpec) (bench.NexmarkRunResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return bench.NexmarkRunResult{}, err
	}
	c := exec.CommandContext(ctx, exe, "bench-nexmark-run", "--query", spec.Query, "--backend", spec.Backend,
		"--events", strconv.FormatInt(spec.Events, 10), "--checkpoint-interval", spec.Interval.String(), "--log-level", "error")
	if spec.StateMemory > 0 {
		c.Args = append(c.Args, "--state-memory", strconv.FormatInt(spec.StateMemory, 10))
	}
	var stdout, stderr strings.Builder
	c.Stdout, c.Stderr = &stdout, &stderr
	dieWithParent(c)
	if err := c.Run(); err != nil {
		return bench.NexmarkRunResult{}, fmt.Errorf("bench-nexmark-run: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var r bench.NexmarkRunResult
	if err := json.Unmarshal([]byte(stdout.String()), &r); err != nil {
		return r, fmt.Errorf("bench-nexmark-run: its result %q: %w", stdout.String(), err)
	}
	r.PeakRSS = max(r.PeakRSS, maxRSS(c))
	return r, nil
}

// benchTaskManagers starts n bench-taskmanager processes of this binary.
func benchTaskManagers(ctx context.Context, jmAddr string, n int) (func(), error) {
	var tms []bench.TaskManager
	stop := func() {
		for _, tm := range tms {
			tm.Stop()
		}
	}
	for i := range n {
		tm, err := benchTaskManager(ctx, jmAddr, fmt.Sprintf("bench-tm-%d", i+1), "")
		if err != nil {
			stop()
			return nil, err
		}
		tms = append(tms, tm)
	}
	return stop, nil
}

// benchTaskManager starts one bench-taskmanager process of this binary
// with the failpoints spec in its WEIR_FAILPOINTS; Kill SIGKILLs it, Stop
// sends SIGTERM; both wait for its exit.
func benchTaskManager(_ context.Context, jmAddr, id, failpoints string) (bench.TaskManager, error) {
	exe, err := os.Executable()
	if err != nil {
		return bench.TaskManager{}, err
	}
	c := exec.Command(exe, "bench-taskmanager", "--jobmanager", jmAddr, "--id", id, "--log-level", "error")
	c.Env = append(os.Environ(), failpoint.EnvVar+"="+failpoints)
	c.Stderr = os.Stderr
	dieWithParent(c)
	if err := c.Start(); err != nil {
		return bench.TaskManager{}, err
	}
	var once sync.Once
	end := func(sig syscall.Signal) {
		once.Do(func() {
			_ = c.Process.Signal(sig)
			_ = c.Wait()
		})
	}
	return bench.TaskManager{Kill: func() { end(syscall.SIGKILL) }, Stop: func() { end(syscall.SIGTERM) }}, nil
}

// benchJobManager starts one `streamctl jobmanager --ha etcd` process of
// this binary for the failover benchmark (its job types are this binary's:
// streamctl registers the wordcount the benchmark submits); Kill SIGKILLs
// it, Stop sends SIGTERM; both wait for its exit.
func benchJobManager(ctx context.Context, h bench.HAJobManager) (bench.JobManager, error) {
	exe, err := os.Executable()
	if err != nil {
		return bench.JobManager{}, err
	}
	c := exec.Command(exe, "jobmanager", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--log-level", "error",
		"--ha", "etcd", "--etcd-endpoints", strings.Join(h.Endpoints, ","), "--ha-cluster-id", h.Cluster,
		"--checkpoint-storage", h.Storage, "--ha-lease-ttl", h.LeaseTTL.String())
	c.Stderr = os.Stderr
	out, err := c.StdoutPipe()
	if err != nil {
		return bench.JobManager{}, err
	}
	dieWithParent(c)
	if err := c.Start(); err != nil {
		return bench.JobManager{}, err
	}
	var once sync.Once
	end := func(sig syscall.Signal) {
		once.Do(func() {
			_ = c.Process.Signal(sig)
			_ = c.Wait()
		})
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "jobmanager listening on "); ok {
				addr <- a
			}
		}
	}()
	select {
	case a := <-addr:
		return bench.JobManager{Addr: a, Kill: func() { end(syscall.SIGKILL) }, Stop: func() { end(syscall.SIGTERM) }}, nil
	case <-time.After(30 * time.Second):
	case <-ctx.Done():
	}
	end(syscall.SIGKILL)
	return bench.JobManager{}, errors.New("bench job manager: no address within 30s")
}
