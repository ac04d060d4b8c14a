package cli

import (
	"strings"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

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
  {"bench":..,"metric":..,"value":..,"baseline":..,"baseline_value":..,"ratio":..,
   "runs":..,"ratio_min":..,"ratio_max":..,"value_min":..,"value_max":..}
A comparison alternates the two sides (Weir, baseline, Weir, baseline, ...):
value and baseline_value are each side's median, ratio the median of the
per-run ratios, ratio_min and ratio_max their spread. --quick keeps the whole
run under a minute (fewer runs, less data). While a benchmark runs, a
progress line goes to stderr (live on a terminal, every few seconds
otherwise).

Benchmarks (--only NAME, repeatable; in run order; eos-wordcount also
reports share-inflight, limits reports limit-produce and
limit-share-consume):
  ` + strings.Join(bench.Names(), "\n  "),
		Args: cobra.NoArgs,
		RunE: a.withLogger(func(cmd *cobra.Command, log *zap.Logger) error {
			cfg.Progress = a.progress(log).Update
			return bench.Run(cmd.Context(), a.stdout, cfg, only...)
		}),
	}
	cmd.Flags().BoolVar(&cfg.Quick, "quick", false, "shorter runs (whole bench under 60 s)")
	cmd.Flags().StringSliceVar(&only, "only", nil, "run only these benchmarks (repeatable): "+strings.Join(bench.Names(), ", "))
	return cmd
}
