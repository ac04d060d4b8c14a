package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/jobmanager"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/taskmanager"
)

// envJobManager names the environment variable with the job manager's
// address, the default of --jobmanager.
const envJobManager = "WEIR_JOBMANAGER"

func defaultJobManager() string {
	if v := os.Getenv(envJobManager); v != "" {
		return v
	}
	return "127.0.0.1:6123"
}

func newJobManagerCmd(a *app) *cobra.Command {
	var listen, httpAddr, dataDir, tokenFile, certFile, keyFile, savepointDir string
	var stor storageFlags
	var allowedHosts, savepointAllowed []string
	var haf haFlags
	var cpTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "jobmanager [--listen 127.0.0.1:6123] [--http 127.0.0.1:8081] [--data-dir DIR] [--ha standalone|etcd|embedded] [--etcd-endpoints URL,...] [--checkpoint-storage URL]",
		Short: "Run a job manager: schedules submitted jobs onto task managers and coordinates their checkpoints",
		Long: `jobmanager serves the control plane (gRPC) on --listen: task managers register,
offer slots and heartbeat both ways (a task manager silent for 3s is lost), and
streamctl submit/list/status/cancel/checkpoints talk to it. A submitted job
runs on the task managers' slots (slot i holds subtask i of every operator, so
a job needs as many slots as its largest parallelism; slots are spread over
the task managers), its checkpoints are coordinated here and stored in pebble
under --data-dir, and a failure (a task, or a whole task manager) restarts it
from the latest completed checkpoint under its restart strategy.

--data-dir keeps the jobs and their checkpoints: a job manager restarted on the
same directory resumes every job that was running, and the task managers
reconnect by themselves. Without it everything is in memory. SIGINT/SIGTERM
suspend the running jobs (tasks stopped, transactions left for the resumed
job to commit or abort), not cancel them.

--http serves the REST API (JSON in Flink's shapes: GET /overview, /jobs,
/jobs/overview, /jobs/ID, /jobs/ID/checkpoints, /jobs/ID/exceptions,
/taskmanagers, ...; PATCH
/jobs/ID?mode=cancel, or POST /jobs/ID/cancel to wait for the end; see
docs/reference/rest.md), the web dashboard (GET /) and Prometheus metrics
(GET /metrics), with the same token rule as the RPC. It answers only requests
whose Host header is a loopback name, the --http host or one of
--rest-allowed-hosts (421 otherwise), and refuses a POST, PUT, PATCH or DELETE
without Content-Type: application/json or an X-Weir-Request header (403): what
a web page cannot send cross-site.

Savepoint locations a client names (submit --from-savepoint, savepoint
--target, stop --savepoint, POST /jobs/ID/savepoints and /stop) must lie
under --savepoint-dir, --data-dir or one of --savepoint-allowed-locations:
anything else is refused as "not an allowed savepoint location" before the
job manager looks at it. Below an allowed directory no symbolic link is
followed and ".." is refused; a savepoint URL must name the bucket and a path
under the prefix of an allowed one, and its endpoint, region and path-style
are the allowed URL's (a client may leave them out), so the job manager sends
its storage credentials nowhere a client chose. See docs/guide/security.md.

High availability: --ha etcd --etcd-endpoints URL,... runs this job manager
as one of several of a cluster (--ha-cluster-id) whose leader is elected in
etcd; --ha embedded runs an etcd inside it (development). Every job manager of
the cluster needs the same --checkpoint-storage. The leader keeps the jobs, the
checkpoint id counters and the completed checkpoints' pointers in etcd (every
write fenced by its leadership) and each completed checkpoint's metadata in the
checkpoint storage, and runs the jobs; a standby answers only who leads and
refuses the rest (HTTP 503) with the leader's address. A new leader resumes
every job that has not ended from its latest completed checkpoint. A leader
that cannot renew its lease for half of --ha-lease-ttl suspends its jobs and
exits (status 1); run it under a supervisor that starts it again. Task
managers and clients take the job managers' addresses comma-separated and find
the leader. See docs/guide/high-availability.md.

It prints "jobmanager listening on HOST:PORT" and "jobmanager http on
HOST:PORT" on stdout once it accepts connections, and stops cleanly on
SIGINT/SIGTERM (a leader resigns, so a standby takes over at once).`,
		Args: cobra.NoArgs,
		RunE: a.withLogger(func(cmd *cobra.Command, log *zap.Logger) error {
			var sec jmSecurity
			if tokenFile != "" {
				var err error
				if sec.token, err = rpc.ReadToken(tokenFile); err != nil {
					return flagError(cmd, err)
				}
				warn(log, rpc.TokenWarnings(tokenFile, sec.token))
			}
			if (certFile == "") != (keyFile == "") {
				return flagError(cmd, errors.New("--tls-cert and --tls-key go together"))
			}
			if certFile != "" {
				var err error
				if sec.tls, err = rpc.ServerTLS(certFile, keyFile); err != nil {
					return flagError(cmd, err)
				}
			}
			for _, addr := range []string{listen, httpAddr} {
				if err := rpc.CheckExposure(addr, sec.token); err != nil {
					return flagError(cmd, err)
				}
			}
			if sec.token != "" && sec.tls == nil {
				warn(log, rpc.ExposureWarnings([]string{listen, httpAddr}, "", ""))
			}
			sec.httpHosts = allowedHosts
			sec.savepointDir = savepointDir
			sec.savepointAllowed = savepointAllowed
			if cpTimeout <= 0 {
				return flagError(cmd, fmt.Errorf("--checkpoint-timeout %v must be positive", cpTimeout))
			}
			if err := stor.check(cmd); err != nil {
				return err
			}
			st, stop, err := stor.jobManager(cmd.Context())
			if err != nil {
				return err
			}
			defer stop()
			// One --checkpoint-storage: task state, and with high
			// availability the completed checkpoints' metadata too.
			haf.storageURL = st.url
			haOpts, closeHA, err := haf.open(cmd.Context(), cmd, log, dataDir)
			if err != nil {
				return err
			}
			defer closeHA()
			opts := append(st.jobManagerOpts(), jobmanager.CheckpointTimeout(cpTimeout))
			return a.runJobManager(cmd.Context(), log, listen, httpAddr, dataDir, sec, nil, append(opts, haOpts...)...)
		}),
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:6123", "control-plane (gRPC) address")
	cmd.Flags().StringVar(&httpAddr, "http", "127.0.0.1:8081", "HTTP address (REST API and /metrics)")
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "directory for the job store and completed checkpoints (created; default: in memory)")
	cmd.Flags().StringVar(&savepointDir, "savepoint-dir", "", "default directory or savepoint URL (s3://bucket/prefix?endpoint=..., opened with the --checkpoint-storage credentials) savepoints are written under (savepoint, stop --savepoint); may be on another disk than --data-dir")
	addSavepointAllowed(cmd, &savepointAllowed, "--savepoint-dir and --data-dir")
	stor.add(cmd, false)
	cmd.Flags().DurationVar(&cpTimeout, "checkpoint-timeout", runtime.DefaultCheckpointTimeout,
		"how long a checkpoint of any job may take from its trigger before it expires (Flink's execution.checkpointing.timeout); raise it for large state")
	cmd.Flags().StringVar(&tokenFile, "auth-token-file", "", "file holding the token every RPC and HTTP request must carry (required beyond loopback)")
	cmd.Flags().StringVar(&certFile, "tls-cert", "", "PEM certificate: serve RPC and HTTP over TLS (with --tls-key)")
	cmd.Flags().StringVar(&keyFile, "tls-key", "", "PEM private key of --tls-cert")
	cmd.Flags().StringSliceVar(&allowedHosts, "rest-allowed-hosts", nil,
		"host names HTTP requests may carry in their Host header besides loopback names and the --http host (comma-separated)")
	haf.add(cmd)
	return cmd
}

// jmSecurity is how a job manager guards its RPC and HTTP.
type jmSecurity struct {
	token string
	tls   *tls.Config
	// httpHosts are the Host names HTTP requests may carry besides loopback
	// names and the HTTP listen host.
	httpHosts []string
	// savepointDir is the default savepoint target ("": none).
	savepointDir string
	// savepointAllowed are where else clients may name savepoints
	// (--savepoint-allowed-locations).
	savepointAllowed []string
}

// addSavepointAllowed adds --savepoint-allowed-locations to a command that
// runs a job manager.
// besides names the command's flags whose locations are allowed too.
func addSavepointAllowed(cmd *cobra.Command, locs *[]string, besides string) {
	cmd.Flags().StringSliceVar(locs, "savepoint-allowed-locations", nil,
		"directories and savepoint URLs under which clients may name savepoints (submit --from-savepoint, savepoint --target, stop --savepoint), besides "+besides+" (comma-separated); no symbolic link below a directory is followed, and a URL's endpoint and region are never a client's")
}

// warn logs each of warnings once, at warn level.
func warn(log *zap.Logger, warnings []string) {
	for _, w := range warnings {
		log.Warn(w)
	}
}

// runJobManager serves a job manager until ctx is done: gRPC on listen,
// HTTP on httpAddr, stores under dataDir ("" in memory). It prints the two
// bound addresses on stdout once both accept connections, and then calls
// ready (if not nil) with the control-plane address.
func (a *app) runJobManager(ctx context.Context, log *zap.Logger, listen, httpAddr, dataDir string, sec jmSecurity, ready func(addr string), extra ...jobmanager.Opt) error {
	if dataDir != "" {
		if err := os.MkdirAll(dataDir, 0o755); err != nil {
			return fmt.Errorf("--data-dir: %w", err)
		}
	}
	fp, err := failpoint.FromEnv()
	if err != nil {
		return err
	}
	opts := []jobmanager.Opt{jobmanager.Logger(log), jobmanager.DataDir(dataDir), jobmanager.Jobs(a.reg),
		jobmanager.Failpoints(fp), jobmanager.AuthToken(sec.token), jobmanager.TLS(sec.tls),
		jobmanager.HTTPHosts(append([]string{httpAddr}, sec.httpHosts...)...), jobmanager.SavepointDir(sec.savepointDir),
		jobmanager.SavepointAllowedLocations(sec.savepointAllowed...)}
	srv, err := jobmanager.New(append(opts, extra...)...)
	if err != nil {
		return err
	}
	defer srv.Close()
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	hl, err := net.Listen("tcp", httpAddr)
	if err != nil {
		lis.Close()
		return fmt.Errorf("--http: %w", err)
	}
	hs := rpc.NewHTTPServer(srv.HTTPHandler(), rpc.HTTPTLS(sec.tls))
	go func() {
		if sec.tls != nil {
			_ = hs.ServeTLS(hl, "", "")
		} else {
			_ = hs.Serve(hl)
		}
	}()
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	fmt.Fprintf(a.stdout, "jobmanager listening on %s\n", lis.Addr())
	fmt.Fprintf(a.stdout, "jobmanager http on %s\n", hl.Addr())
	log.Info("job manager started", zap.String("listen", lis.Addr().String()), zap.String("http", hl.Addr().String()))
	if ready != nil {
		ready(lis.Addr().String())
	}
	return srv.Serve(ctx, lis)
}

func newTaskManagerCmd(a *app) *cobra.Command {
	var jm, dataDir, id, dataHost, dataAdvertise, dataPorts, metricsAddr, storageURL string
	var metricsHosts []string
	var access accessFlags
	var slots int
	var stateMem byteSize
	cmd := &cobra.Command{
		Use:   "taskmanager [--jobmanager 127.0.0.1:6123] [--slots 2] [--data-dir DIR] [--state-memory SIZE]",
		Short: "Run a task manager: runs the tasks the job manager deploys into its slots",
		Long: `taskmanager registers with the job manager (--jobmanager, default $WEIR_JOBMANAGER
or 127.0.0.1:6123) offering --slots slots, heartbeats both ways, and reconnects by
itself when the session is lost (a job manager restarted, or silent for the
timeout it announced). It runs the tasks the job manager deploys, building each
job from its registered type (every node runs the same binary), and exchanges
records with the other task managers on --data-host (one port per deployment,
credit-based flow control). A lost session cancels its tasks. Stops cleanly on
SIGINT/SIGTERM.

Behind a firewall, NAT or proxy: --data-ports LO-HI listens only on those ports
(the first free one per deployment), and --data-advertise HOST tells the other
task managers to dial HOST with the same port instead of --data-host.

--metrics HOST:PORT serves Prometheus metrics on GET /metrics (each task's
records in and out and back-pressured time, and its operators' metrics); it
prints "taskmanager metrics on HOST:PORT" once it listens. Beyond loopback it
needs --auth-token-file, and every scrape must carry the token. A scrape's Host
header must be a loopback name, the --metrics host or one of
--metrics-allowed-hosts (421 otherwise).`,
		Args: cobra.NoArgs,
		RunE: a.withLogger(func(cmd *cobra.Command, log *zap.Logger) error {
			if slots < 1 {
				return flagError(cmd, fmt.Errorf("--slots %d must be at least 1", slots))
			}
			if dataDir != "" {
				if err := os.MkdirAll(dataDir, 0o755); err != nil {
					return fmt.Errorf("--data-dir: %w", err)
				}
			}
			if id == "" {
				host, _ := os.Hostname()
				id = fmt.Sprintf("%s-%d", host, os.Getpid())
			}
			fp, err := failpoint.FromEnv()
			if err != nil {
				return err
			}
			opts := []taskmanager.Opt{taskmanager.ID(id), taskmanager.Slots(slots), taskmanager.Logger(log),
				taskmanager.Jobs(a.reg), taskmanager.DataHost(dataHost), taskmanager.Failpoints(fp),
				taskmanager.StateMemory(int64(stateMem))}
			if dataDir != "" {
				opts = append(opts, taskmanager.StateDir(filepath.Join(dataDir, "state")))
			}
			if dataPorts != "" {
				lo, hi, err := parsePortRange(dataPorts)
				if err != nil {
					return flagError(cmd, fmt.Errorf("--data-ports: %w", err))
				}
				opts = append(opts, taskmanager.DataPorts(lo, hi))
			}
			if dataAdvertise != "" {
				opts = append(opts, taskmanager.DataAdvertise(dataAdvertise))
			}
			token, tlsCfg, err := access.load()
			if err != nil {
				return err
			}
			if access.tokenFile != "" {
				warn(log, rpc.TokenWarnings(access.tokenFile, token))
			}
			if tlsCfg == nil {
				warn(log, rpc.ExposureWarnings(nil, "", dataHost))
			}
			opts = append(opts, taskmanager.AuthToken(token))
			if tlsCfg != nil {
				opts = append(opts, taskmanager.TLS(tlsCfg))
			}
			if metricsAddr != "" {
				if err := rpc.CheckExposure(metricsAddr, token); err != nil {
					return flagError(cmd, fmt.Errorf("--metrics: %w", err))
				}
				reg, stop, err := a.serveMetrics(cmd.Context(), metricsAddr, token, metricsHosts)
				if err != nil {
					return err
				}
				defer stop()
				opts = append(opts, taskmanager.Metrics(reg))
			}
			if storageURL != "" {
				st, err := storage.Open(cmd.Context(), storageURL)
				if err != nil {
					return flagError(cmd, fmt.Errorf("--checkpoint-storage: %w", err))
				}
				err = probeStorage(cmd.Context(), st, storageURL)
				st.Close()
				if err != nil {
					return err
				}
				opts = append(opts, taskmanager.CheckpointStorage(storageURL))
			}
			err = taskmanager.Run(cmd.Context(), jm, opts...)
			if errors.Is(err, context.Canceled) && cmd.Context().Err() != nil {
				return nil
			}
			return err
		}),
	}
	cmd.Flags().StringVar(&jm, "jobmanager", defaultJobManager(),
		"job manager address, or several comma-separated (any job managers of a highly available cluster: the leader is found) (default $"+envJobManager+" or 127.0.0.1:6123)")
	cmd.Flags().IntVar(&slots, "slots", 2, "slots offered to the job manager")
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "directory for the task manager's state: the pebble state backend's instances in DIR/state, emptied at start (created; default: a temporary directory)")
	addStateMemory(cmd, &stateMem)
	cmd.Flags().StringVar(&dataHost, "data-host", "127.0.0.1", "host the other task managers reach this one's data plane on")
	cmd.Flags().StringVar(&dataPorts, "data-ports", "", "data-plane port range LO-HI, the first free one per deployment (default: any free port)")
	cmd.Flags().StringVar(&storageURL, "checkpoint-storage", "",
		"URL of the checkpoint storage to write task state to and restore it from, instead of the one the job manager sends with each deployment (the same store reached another way); default: the job manager's")
	cmd.Flags().StringVar(&dataAdvertise, "data-advertise", "", "host the other task managers dial for this one's data plane, same port (default: --data-host)")
	cmd.Flags().StringVar(&metricsAddr, "metrics", "", "HTTP address of the Prometheus /metrics endpoint (default: none)")
	cmd.Flags().StringSliceVar(&metricsHosts, "metrics-allowed-hosts", nil,
		"host names scrapes may carry in their Host header besides loopback names and the --metrics host (comma-separated)")
	access.add(cmd)
	cmd.Flags().StringVar(&id, "id", "", "task manager id (default HOST-PID)")
	return cmd
}

// parsePortRange parses "LO-HI" (1 <= LO <= HI <= 65535).
func parsePortRange(s string) (lo, hi int, err error) {
	a, b, ok := strings.Cut(s, "-")
	if ok {
		lo, err = strconv.Atoi(a)
		if err == nil {
			hi, err = strconv.Atoi(b)
		}
	}
	if !ok || err != nil || lo < 1 || hi < lo || hi > 65535 {
		return 0, 0, fmt.Errorf("%q is not a port range LO-HI", s)
	}
	return lo, hi, nil
}

// serveMetrics serves a new metrics registry (with the Go runtime's and the
// process's metrics) on GET /metrics at addr until stop is called, and
// prints "taskmanager metrics on HOST:PORT". Requests must carry token,
// if set, and name addr's host, a loopback name or one of hosts in their
// Host header (rpc.BrowserGuard).
func (a *app) serveMetrics(ctx context.Context, addr, token string, hosts []string) (*prometheus.Registry, func(), error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	hs := rpc.NewHTTPServer(rpc.BrowserGuard(append([]string{addr}, hosts...), rpc.RequireToken(token, mux)))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = hs.Serve(l)
	}()
	fmt.Fprintf(a.stdout, "taskmanager metrics on %s\n", l.Addr())
	return reg, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
		<-done
	}, nil
}
