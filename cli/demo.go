package cli

import (
	"os"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/weirstream/weir/internal/demo"
	"github.com/weirstream/weir/internal/failpoint"
)

func newDemoCmd(a *app) *cobra.Command {
	cfg := demo.DefaultConfig()
	cmd := &cobra.Command{
		Use:   "demo [--lines N] [--partitions N] [--timeout DUR]",
		Short: "Run the exactly-once wordcount end to end: broker, data, a failure, verification",
		Long: `demo starts the embedded Kafka broker in-process, writes a generated corpus to
the topic "lines", runs the exactly-once wordcount job (share group -> running
count per word -> transactional sink to "counts") on the in-process mini
cluster, injects one task failure a third of the way through the words (the
job restarts from its latest completed checkpoint), waits for the complete
output and checks it independently, read_committed: every word's values must
be exactly 1..n.

Results go to stdout; while the job runs, a progress line goes to stderr (live
on a terminal, every few seconds otherwise). It prints "exactly-once
verified: ..." and exits 0, or prints the violation and exits 1.
Failpoints in WEIR_FAILPOINTS are added to the injected failure.`,
		Args: cobra.NoArgs,
		RunE: a.withLogger(func(cmd *cobra.Command, log *zap.Logger) error {
			cfg.Logger = log
			cfg.Failpoints = os.Getenv(failpoint.EnvVar)
			cfg.Progress = a.progress(log).Update
			return demo.Run(cmd.Context(), a.stdout, cfg)
		}),
	}
	cmd.Flags().IntVar(&cfg.Lines, "lines", cfg.Lines, "lines of generated input (at least 1)")
	cmd.Flags().Int32Var(&cfg.Partitions, "partitions", cfg.Partitions, "partitions of the input topic (at least 1)")
	cmd.Flags().DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "how long to wait for the complete output")
	return cmd
}
