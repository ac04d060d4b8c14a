package cli

import (
	"os"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/test/demo"
)

func newDemoCmd(a *app) *cobra.Command {
	cfg := demo.DefaultConfig()
	cmd := &cobra.Command{
		Use:   "demo [--lines N] [--partitions N] [--timeout DUR]",
		Short: "Run the exactly-once wordcount end to end: broker, data, a failure, verification",
		Long: `demo runs a Weir cluster as real processes of this binary (the embedded Kafka
broker, a job manager and two task managers of 2 slots each, all on
loopback), submits the exactly-once wordcount (share group on "lines" ->
running count per word -> transactional sink to "counts", parallelism 2,
checkpoints every 200ms) and writes a generated corpus while it runs. Once a
checkpoint has completed and committed output, it SIGKILLs task manager
demo-tm-1 and prints how many output records were committed; the job manager
restarts the job on demo-tm-2 from its latest completed checkpoint, and the
demo prints which one. It waits for the complete output and checks it
independently, read_committed: every word's values must be exactly 1..n.

Results go to stdout; while the job runs, a progress line goes to stderr (live
on a terminal, every few seconds otherwise), with the processes' warnings.
It prints "exactly-once verified: ..." and exits 0, or prints the violation
and exits 1. WEIR_FAILPOINTS is passed on to the processes.`,
		Args: cobra.NoArgs,
		RunE: a.withLogger(func(cmd *cobra.Command, log *zap.Logger) error {
			cfg.Logger = log
			cfg.Failpoints = os.Getenv(failpoint.EnvVar)
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			cfg.Exe, cfg.Stderr, cfg.LogFormat = exe, a.stderrSink(), a.logFormat
			cfg.Progress = a.progress(log).Update
			return demo.Run(cmd.Context(), a.stdout, cfg)
		}),
	}
	cmd.Flags().IntVar(&cfg.Lines, "lines", cfg.Lines, "lines of generated input (at least 1)")
	cmd.Flags().Int32Var(&cfg.Partitions, "partitions", cfg.Partitions, "partitions of the input topic (at least 1)")
	cmd.Flags().DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "how long to wait for the complete output")
	return cmd
}
