package main

import (
	"github.com/spf13/cobra"

	"github.com/weirstream/weir/internal/demo"
)

func newDemoCmd(a *app) *cobra.Command {
	var cfg demo.Config
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the exactly-once wordcount end to end: broker, data, a failure, verification",
		Long: `demo starts the embedded Kafka broker in-process, writes a generated corpus to
the topic "lines", runs the exactly-once wordcount job (share group -> running
count per word -> transactional sink to "counts") on the in-process mini
cluster, injects one task failure mid-run (the job restarts from its latest
checkpoint), waits for the complete output and checks it independently,
read_committed: every word's values must be exactly 1..n.

It prints "exactly-once verified: ..." and exits 0, or prints the violation
and exits 1.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := a.logger()
			if err != nil {
				return err
			}
			defer func() { _ = log.Sync() }()
			cfg.Logger = log
			return demo.Run(cmd.Context(), a.stdout, cfg)
		},
	}
	cmd.Flags().IntVar(&cfg.Lines, "lines", 20000, "lines of generated input")
	cmd.Flags().Int32Var(&cfg.Partitions, "partitions", 8, "partitions of the input topic")
	cmd.Flags().DurationVar(&cfg.Timeout, "timeout", 0, "how long to wait for the complete output (default 3m)")
	return cmd
}
