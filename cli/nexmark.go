package cli

import (
	"fmt"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/weirstream/weir/examples/nexmark"
)

func newNexmarkCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "nexmark generate",
		Short: "Nexmark tools: write the generator's events to Kafka",
		Long: `nexmark groups the tools of the Nexmark benchmark (the job type "nexmark" runs
its queries; docs/guide/nexmark.md).`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newNexmarkGenerateCmd(a))
	return cmd
}

func newNexmarkGenerateCmd(a *app) *cobra.Command {
	var (
		brokers    []string
		topic      string
		partitions int32
		c          nexmark.GeneratorConfig
	)
	cmd := &cobra.Command{
		Use:   "generate --brokers HOST:PORT --topic TOPIC --events N [--rate R]",
		Short: "Write Nexmark events to a Kafka topic as JSON",
		Long: `generate writes the Nexmark generator's events 0 to N-1 to TOPIC as JSON values
({"event_type":0|1|2,"person"|"auction"|"bid":{...}}, times in epoch ms), each
with its event time as the record timestamp, creating the topic when missing.
They are the events the nexmark job's in-process generator makes with the same
--events, --rate, --base-time and --out-of-order-group: run a query on them with
"--set source=sharegroup --set topic=TOPIC". It prints the number of events
written on stdout when every record is acknowledged.`,
		Args: cobra.NoArgs,
		RunE: a.withLogger(func(cmd *cobra.Command, log *zap.Logger) error {
			g, err := nexmark.NewGenerator(c)
			if err != nil {
				return flagError(cmd, err)
			}
			err = nexmark.WriteToKafka(cmd.Context(), brokers, topic, partitions, g, func(n int64) {
				log.Info("nexmark events written", zap.Int64("events", n))
			})
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(a.stdout, c.Events)
			return err
		}),
	}
	f := cmd.Flags()
	f.StringSliceVar(&brokers, "brokers", []string{"127.0.0.1:9092"}, "Kafka seed brokers")
	f.StringVar(&topic, "topic", "nexmark", "topic to write, created when missing")
	f.Int32Var(&partitions, "partitions", 0, "partitions of a created topic (0: the broker's default)")
	f.Int64Var(&c.Events, "events", 100_000, "number of events")
	f.Int64Var(&c.Rate, "rate", 10_000, "events per second of event time (sets event times; does not throttle)")
	f.Int64Var(&c.BaseTime, "base-time", nexmark.DefaultBaseTime, "time of event 0, epoch ms")
	f.Int64Var(&c.OutOfOrderGroup, "out-of-order-group", 1, "permute event ids within groups of this many events (1: none)")
	return cmd
}
