package main

import (
	"github.com/spf13/cobra"

	"github.com/weirstream/weir/internal/bench"
)

func newBenchCmd(a *app) *cobra.Command {
	var cfg bench.Config
	var only []string
	cmd := &cobra.Command{
		Use:   "bench [--quick] [--only NAME]...",
		Short: "Run Weir's benchmarks; print one JSON line per result",
		Long: `bench runs every benchmark against a hand-written baseline on the same data in
the same process run, and prints one JSON object per result on stdout:
  {"bench":..,"metric":..,"value":..,"baseline":..,"baseline_value":..,"ratio":..}
--quick keeps the whole run under a minute.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return bench.Run(cmd.Context(), a.stdout, cfg, only...)
		},
	}
	cmd.Flags().BoolVar(&cfg.Quick, "quick", false, "shorter runs (whole bench under 60 s)")
	cmd.Flags().StringSliceVar(&only, "only", nil, "run only these benchmarks (repeatable)")
	return cmd
}
