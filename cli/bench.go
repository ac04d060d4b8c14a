package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/weirstream/weir/internal/bench"
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
share-inflight, limits reports limit-produce and limit-share-consume,
nexmark reports nexmark-generator and nexmark-QUERY-cp10s and -cp1s per query,
each in events per CPU-second with events_per_s; WEIR_NEXMARK_CPUPROFILE=DIR
writes a CPU profile of each query run):
  ` + strings.Join(bench.Names(), "\n  "),
		Args: cobra.NoArgs,
		RunE: a.withLogger(func(cmd *cobra.Command, log *zap.Logger) error {
			cfg.Progress = a.progress(log).Update
			cfg.TaskManagers = benchTaskManagers
			return bench.Run(cmd.Context(), a.stdout, cfg, only...)
		}),
	}
	cmd.Flags().BoolVar(&cfg.Quick, "quick", false, "shorter runs (whole bench under 60 s)")
	cmd.Flags().Int64Var(&cfg.NexmarkEvents, "nexmark-events", 0, "events per nexmark run (0: 2000000, 200000 with --quick)")
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
			err = taskmanager.Run(cmd.Context(), jm, taskmanager.ID(id), taskmanager.Slots(1), taskmanager.Logger(log), taskmanager.Jobs(reg))
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

// benchTaskManagers starts n bench-taskmanager processes of this binary.
func benchTaskManagers(ctx context.Context, jmAddr string, n int) (func(), error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var cmds []*exec.Cmd
	stop := func() {
		for _, c := range cmds {
			_ = c.Process.Signal(syscall.SIGTERM)
		}
		for _, c := range cmds {
			_ = c.Wait()
		}
	}
	for i := range n {
		c := exec.Command(exe, "bench-taskmanager", "--jobmanager", jmAddr, "--id", fmt.Sprintf("bench-tm-%d", i+1), "--log-level", "error")
		c.Stderr = os.Stderr
		dieWithParent(c)
		if err := c.Start(); err != nil {
			stop()
			return nil, err
		}
		cmds = append(cmds, c)
	}
	return stop, nil
}
