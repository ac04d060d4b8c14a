package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/taskmanager"
)

func newLocalCmd(a *app) *cobra.Command {
	var (
		brokerAddr, dataDir, listen, httpAddr, metricsAddr string
		tms, slots, brokerPort                             int
		stor                                               storageFlags
	)
	cmd := &cobra.Command{
		Use:   "local [--broker embedded|HOST:PORT] [--broker-port 9092] [--taskmanagers 2] [--slots 2] [--data-dir DIR]",
		Short: "Run a development cluster in one process: a broker, a job manager and task managers",
		Long: `local runs, in this one process, an embedded broker (unless --broker names an
external one), a job manager (control plane on --listen, HTTP on --http) and
--taskmanagers task managers of --slots slots each, talking to each other over
loopback exactly as separate processes do. Submit jobs to it with
"streamctl submit JOB --jobmanager ADDR --set brokers=BROKER".

The embedded broker listens on 127.0.0.1:--broker-port (default 9092, Kafka's
port, so --set brokers=127.0.0.1:9092 reaches it; 0 takes a random port).

--data-dir keeps the embedded broker's data (DIR/broker) and the job manager's
jobs and checkpoints (DIR/jobmanager): started again on the same directory (and
the same --broker-port: a job keeps the broker address it was submitted with),
the cluster resumes its jobs. --metrics serves every task manager's Prometheus
metrics on one address (GET /metrics; the job manager's are on --http). It prints "broker listening on HOST:PORT",
"jobmanager listening on HOST:PORT" and "jobmanager http on HOST:PORT" on
stdout, and stops on SIGINT/SIGTERM (running jobs are suspended, not
cancelled).`,
		Args: cobra.NoArgs,
		RunE: a.withLogger(func(cmd *cobra.Command, log *zap.Logger) error {
			if tms < 1 {
				return flagError(cmd, fmt.Errorf("--taskmanagers %d must be at least 1", tms))
			}
			if slots < 1 {
				return flagError(cmd, fmt.Errorf("--slots %d must be at least 1", slots))
			}
			for _, addr := range []string{listen, httpAddr, metricsAddr} {
				if addr == "" {
					continue
				}
				if err := rpc.CheckExposure(addr, ""); err != nil {
					return flagError(cmd, fmt.Errorf("local runs on loopback only: %w", err))
				}
			}
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			if brokerPort < 0 || brokerPort > 65535 {
				return flagError(cmd, fmt.Errorf("--broker-port %d: want 0 (random) to 65535", brokerPort))
			}
			if brokerAddr == "embedded" {
				listenOn := net.JoinHostPort("127.0.0.1", strconv.Itoa(brokerPort))
				opts := []broker.Opt{broker.Listen(listenOn), broker.Logger(log.Named("broker"))}
				if dataDir != "" {
					opts = append(opts, broker.DataDir(filepath.Join(dataDir, "broker")))
				}
				b, err := broker.Start(ctx, opts...)
				if errors.Is(err, syscall.EADDRINUSE) {
					return flagError(cmd, fmt.Errorf("the embedded broker cannot listen on %s: the port is taken (another broker or `streamctl local`?); choose another with --broker-port, or --broker-port 0 for a random one", listenOn))
				}
				if err != nil {
					return err
				}
				defer b.Close()
				brokerAddr = b.Addr()
			}
			fmt.Fprintf(a.stdout, "broker listening on %s\n", brokerAddr)
			jmDir := ""
			if dataDir != "" {
				jmDir = filepath.Join(dataDir, "jobmanager")
			}
			fp, err := failpoint.FromEnv()
			if err != nil {
				return err
			}
			if err := stor.check(cmd); err != nil {
				return err
			}
			st, stopStorage, err := stor.jobManager(ctx)
			if err != nil {
				return err
			}
			defer stopStorage()
			if st.url != "" {
				fmt.Fprintf(a.stdout, "checkpoint storage %s\n", st.url)
			}
			addrs := make(chan string, 1)
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			jmDone := make(chan error, 1)
			go func() {
				jmDone <- a.runJobManager(ctx, log.Named("jobmanager"), listen, httpAddr, jmDir, jmSecurity{}, st, func(addr string) { addrs <- addr })
			}()
			var jmAddr string
			select {
			case jmAddr = <-addrs:
			case err := <-jmDone:
				return err
			}
			tmOpts := []taskmanager.Opt{taskmanager.Slots(slots), taskmanager.Jobs(a.reg), taskmanager.Failpoints(fp)}
			if st.url != "" {
				tmOpts = append(tmOpts, taskmanager.CheckpointStorage(st.url, st.opts...))
			}
			if metricsAddr != "" {
				reg, stop, err := a.serveMetrics(ctx, metricsAddr, "", nil)
				if err != nil {
					return err
				}
				defer stop()
				tmOpts = append(tmOpts, taskmanager.Metrics(reg))
			}
			for i := 0; i < tms; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					id := fmt.Sprintf("local-tm-%d", i+1)
					err := taskmanager.Run(ctx, jmAddr, append(slices.Clip(tmOpts), taskmanager.ID(id), taskmanager.Logger(log.Named(id)))...)
					if err != nil && !errors.Is(err, context.Canceled) {
						log.Error("task manager stopped", zap.String("task_manager", id), zap.Error(err))
					}
				}()
			}
			return <-jmDone
		}),
	}
	f := cmd.Flags()
	f.StringVar(&brokerAddr, "broker", "embedded", `"embedded" or the HOST:PORT of an external broker`)
	f.IntVar(&brokerPort, "broker-port", 9092, "port of the embedded broker on 127.0.0.1 (0: a random one)")
	f.IntVar(&tms, "taskmanagers", 2, "task managers to run")
	f.IntVar(&slots, "slots", 2, "slots per task manager")
	f.StringVar(&dataDir, "data-dir", "", "directory for the broker's and job manager's data (default: in memory)")
	f.StringVar(&listen, "listen", "127.0.0.1:6123", "job manager control-plane (gRPC) address")
	f.StringVar(&httpAddr, "http", "127.0.0.1:8081", "job manager HTTP address (REST API and /metrics)")
	f.StringVar(&metricsAddr, "metrics", "", "HTTP address of the task managers' Prometheus /metrics (default: none)")
	stor.add(cmd, true)
	return cmd
}
