package cli

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/rpc"
)

func newBrokerCmd(a *app) *cobra.Command {
	var (
		listen     string
		advertise  string
		dataDir    string
		partitions int
		autoCreate bool
		configs    []string
	)
	cmd := &cobra.Command{
		Use:   "broker",
		Short: "Run the embedded Kafka broker",
		Long: `Run Weir's embedded Kafka broker (kfake): one broker speaking the real Kafka
protocol (share groups, transactions) on --listen, usable from any Kafka client.

It has no authentication: bound beyond loopback (--listen 0.0.0.0:9092) it
warns at startup, and anyone who reaches it can read and write every topic.

It prints "broker listening on HOST:PORT" on stdout once it accepts connections,
and stops cleanly on SIGINT or SIGTERM, persisting its state to --data-dir.
Without --data-dir everything is kept in memory and lost on stop.

Default broker configs (override with --config key=value):
` + defaultsHelp(),
		Example: `  streamctl broker
  streamctl broker --data-dir /tmp/weir-broker --partitions 4
  streamctl broker --config group.share.record.lock.duration.ms=15000`,
		Args: cobra.NoArgs,
		RunE: a.withLogger(func(cmd *cobra.Command, log *zap.Logger) error {

			opts := []broker.Opt{
				broker.Listen(listen),
				broker.Partitions(partitions),
				broker.AutoCreateTopics(autoCreate),
				broker.Logger(log),
			}
			if advertise != "" {
				opts = append(opts, broker.Advertise(advertise))
			}
			if dataDir != "" {
				opts = append(opts, broker.DataDir(dataDir))
			}
			for _, kv := range configs {
				k, v, err := broker.ParseConfig(kv)
				if err != nil {
					return fmt.Errorf("--config: %w", err)
				}
				opts = append(opts, broker.Config(k, v))
			}

			ctx := cmd.Context()
			b, err := broker.Start(ctx, opts...)
			if err != nil {
				return err
			}
			if _, err := fmt.Fprintf(a.stdout, "broker listening on %s\n", b.Addr()); err != nil {
				_ = b.Close()
				return err
			}
			reportAddrs(ctx, log, b.Bound(), b.Addr())
			warn(log, rpc.ExposureWarnings(nil, b.Bound(), ""))
			<-ctx.Done()
			log.Info("stopping broker", zap.String("reason", context.Cause(ctx).Error()))
			return b.Close()
		}),
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", broker.DefaultListen, "host:port to listen on (port 0 picks a free port)")
	f.StringVar(&advertise, "advertise", "", "host:port clients are told to connect to (default: the listen address; 127.0.0.1 if it binds all interfaces)")
	f.StringVar(&dataDir, "data-dir", "", "directory to persist state in across restarts (default: in memory)")
	f.IntVar(&partitions, "partitions", broker.DefaultPartitions, "partitions of topics created without a count (auto-created, or CreateTopics with -1)")
	f.BoolVar(&autoCreate, "auto-create-topics", true, "create a missing topic when a client's metadata request asks for it (as Kafka's auto.create.topics.enable)")
	f.StringArrayVar(&configs, "config", nil, "broker config key=value (repeatable); overrides the defaults listed above")
	return cmd
}

// defaultsHelp renders broker.DefaultConfigs for the help text.
func defaultsHelp() string {
	var b strings.Builder
	for _, d := range broker.DefaultConfigs() {
		fmt.Fprintf(&b, "  %s=%s (Kafka: %s)\n", d.Key, d.Value, d.Kafka)
		line := "     "
		for _, w := range strings.Fields(d.Why) {
			if len(line)+1+len(w) > 80 {
				b.WriteString(line + "\n")
				line = "     "
			}
			line += " " + w
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// reportAddrs says, when they differ, what the broker bound and what it
// tells clients (stdout's line is the advertised address, which clients
// dial), and warns when the advertised host does not resolve here.
func reportAddrs(ctx context.Context, log *zap.Logger, bound, advertised string) {
	if bound != advertised {
		log.Info("broker bound to one address and advertises another: clients are told to connect to the advertised one",
			zap.String("bound", bound), zap.String("advertised", advertised))
	}
	host, _, err := net.SplitHostPort(advertised)
	if err != nil || net.ParseIP(host) != nil {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := net.DefaultResolver.LookupHost(rctx, host); err != nil {
		log.Warn("the advertised host does not resolve here: clients that cannot resolve it cannot connect",
			zap.String("advertised", advertised), zap.String("bound", bound), zap.Error(err))
	}
}
