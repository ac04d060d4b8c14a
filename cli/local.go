package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/jobmanager"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/taskmanager"
)

func newLocalCmd(a *app) *cobra.Command {
	var (
		brokerAddr, dataDir, listen, httpAddr, metricsAddr, haMode string
		tms, slots, brokerPort, jms                                int
		stor                                                       storageFlags
		savepointAllowed                                           []string
		stateBackend                                               string
		stateMem                                                   byteSize
	)
	cmd := &cobra.Command{
		Use:   "local [--broker embedded|HOST:PORT] [--broker-port 9092] [--taskmanagers 2] [--slots 2] [--data-dir DIR] [--ha embedded --jobmanagers N]",
		Short: "Run a development cluster in one process: a broker, a job manager and task managers",
		Long: `local runs, in this one process, an embedded broker (unless --broker names an
external one), a job manager (control plane on --listen, HTTP on --http) and
--taskmanagers task managers of --slots slots each, talking to each other over
loopback exactly as separate processes do. Submit jobs to it with
"streamctl submit JOB --jobmanager ADDR --set brokers=BROKER".

The embedded broker listens on 127.0.0.1:--broker-port (default 9092, Kafka's
port, so --set brokers=127.0.0.1:9092 reaches it; 0 takes a random port).

--state-backend sets the state backend of the jobs submitted without one
(submit --state-backend wins), --state-memory each task manager's memory budget
for the pebble state backend.

--data-dir keeps the embedded broker's data (DIR/broker) and the job manager's
jobs and checkpoints (DIR/jobmanager): started again on the same directory (and
the same --broker-port: a job keeps the broker address it was submitted with),
the cluster resumes its jobs. --metrics serves every task manager's Prometheus
metrics on one address (GET /metrics; the job manager's are on --http).

Savepoints a client names (submit --from-savepoint, savepoint --target, stop
--savepoint) must lie under --data-dir or --savepoint-allowed-locations, as
with "streamctl jobmanager"; without either, none can be named.

--ha embedded --jobmanagers N runs an etcd in the process and N job managers
electing a leader, as "jobmanager --ha etcd" does (checkpoint metadata in
DIR/checkpoints, or in memory): the first leads (its addresses are printed
first, the others' after), the task managers are given every job manager.
For trying high availability out; it is not highly available (one process).

It prints "broker listening on HOST:PORT" (with --broker HOST:PORT, "using
broker HOST:PORT": it runs none), "jobmanager listening on HOST:PORT" and
"jobmanager http on HOST:PORT" on stdout, then "cluster ready: N task
managers of S slots" once every task manager has registered (a job
submitted before then may find too few slots), and stops on SIGINT/SIGTERM
(running jobs are suspended, not cancelled).`,
		Args: cobra.NoArgs,
		RunE: a.withLogger(func(cmd *cobra.Command, log *zap.Logger) error {
			if tms < 1 {
				return flagError(cmd, fmt.Errorf("--taskmanagers %d must be at least 1", tms))
			}
			if slots < 1 {
				return flagError(cmd, fmt.Errorf("--slots %d must be at least 1", slots))
			}
			var backendOpts []jobmanager.Opt
			if stateBackend != "" {
				k, err := runtime.ParseStateBackend(stateBackend)
				if err != nil {
					return flagError(cmd, fmt.Errorf("--state-backend: %w", err))
				}
				backendOpts = append(backendOpts, jobmanager.DefaultStateBackend(k))
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
				fmt.Fprintf(a.stdout, "broker listening on %s\n", brokerAddr)
			} else {
				// No broker runs here: say which one the jobs use.
				fmt.Fprintf(a.stdout, "using broker %s\n", brokerAddr)
			}
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
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			var haOpts []func() ([]jobmanager.Opt, error)
			switch haMode {
			case "standalone":
				if jms != 1 {
					return flagError(cmd, fmt.Errorf("--jobmanagers %d: several job managers need --ha embedded", jms))
				}
				haOpts = []func() ([]jobmanager.Opt, error){func() ([]jobmanager.Opt, error) { return nil, nil }}
			case "embedded":
				if jms < 1 {
					return flagError(cmd, fmt.Errorf("--jobmanagers %d must be at least 1", jms))
				}
				opts, closeHA, err := localHA(ctx, log, dataDir, jms, st.url, st.opts)
				if err != nil {
					return err
				}
				defer closeHA() // after the job managers stopped (deferred below)
				haOpts = opts
				jmDir = ""
			default:
				return flagError(cmd, fmt.Errorf("--ha %q: want standalone or embedded", haMode))
			}
			jmDone := make(chan error, len(haOpts))
			running := 0 // job managers not yet stopped
			defer func() {
				cancel()
				for ; running > 0; running-- {
					<-jmDone
				}
			}()
			// The job manager's allowed savepoint locations: all of
			// --data-dir, not only its jobmanager/ part.
			allowed := slices.Clip(savepointAllowed)
			if dataDir != "" {
				allowed = append(allowed, dataDir)
			}
			var jmAddrs []string
			for i, opts := range haOpts {
				extra, err := opts()
				if err != nil {
					return err
				}
				l, h, name := listen, httpAddr, "jobmanager"
				if i > 0 {
					l, h, name = "127.0.0.1:0", "127.0.0.1:0", fmt.Sprintf("jobmanager-%d", i+1)
				}
				addrs := make(chan string, 1)
				running++
				go func() {
					jmDone <- a.runJobManager(ctx, log.Named(name), l, h, jmDir, jmSecurity{savepointAllowed: allowed}, func(addr string) { addrs <- addr }, append(append(st.jobManagerOpts(), backendOpts...), extra...)...)
				}()
				select {
				case addr := <-addrs:
					jmAddrs = append(jmAddrs, addr)
				case err := <-jmDone:
					running--
					return err
				}
				if i == 0 && haMode == "embedded" {
					// The first job manager leads: the address printed
					// first is the leader's.
					wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
					err := rpc.WaitLeading(wctx, jmAddrs[0])
					wcancel()
					if err != nil {
						return err
					}
				}
			}
			jmAddr := strings.Join(jmAddrs, ",")
			tmOpts := []taskmanager.Opt{taskmanager.Slots(slots), taskmanager.Jobs(a.reg), taskmanager.Failpoints(fp),
				taskmanager.StateMemory(int64(stateMem))}
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
			// The cluster is ready once every task manager has registered:
			// a job submitted before then could find no slots.
			registered := make(chan struct{}, tms)
			for i := 0; i < tms; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					id := fmt.Sprintf("local-tm-%d", i+1)
					var once sync.Once
					onReg := taskmanager.OnRegistered(func(uint64) { once.Do(func() { registered <- struct{}{} }) })
					err := taskmanager.Run(ctx, jmAddr, append(slices.Clip(tmOpts), taskmanager.ID(id), taskmanager.Logger(log.Named(id)), onReg)...)
					if err != nil && !errors.Is(err, context.Canceled) {
						log.Error("task manager stopped", zap.String("task_manager", id), zap.Error(err))
					}
				}()
			}
			for n := 0; n < tms; n++ {
				select {
				case <-registered:
				case err := <-jmDone:
					running--
					return err
				}
			}
			fmt.Fprintf(a.stdout, "cluster ready: %d task managers of %d slots\n", tms, slots)
			err = <-jmDone // the first job manager to stop stops the cluster
			running--
			return err
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
	f.StringVar(&haMode, "ha", "standalone", `"standalone" (one job manager) or "embedded" (an etcd in this process and --jobmanagers job managers electing a leader, as --ha etcd does)`)
	f.IntVar(&jms, "jobmanagers", 1, "job managers to run (more than one needs --ha embedded)")
	f.StringVar(&stateBackend, "state-backend", "", `state backend of the jobs submitted without one: "heap" or "pebble" (default: heap)`)
	addStateMemory(cmd, &stateMem)
	addSavepointAllowed(cmd, &savepointAllowed, "--data-dir")
	stor.add(cmd, true)
	return cmd
}
