package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/jobmanager"
	"github.com/weirstream/weir/jobmanager/ha"
)

// haFlags are the job manager's high-availability flags. storageURL is
// --checkpoint-storage (storageFlags), which HA requires: every job
// manager of the cluster must reach the completed checkpoints' metadata.
type haFlags struct {
	mode, cluster, storageURL, advertise string
	endpoints                            []string
	cacert, cert, key                    string
	username, passwordFile               string
	leaseTTL                             time.Duration
}

func (f *haFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.mode, "ha", "standalone", `high availability: "standalone" (one job manager, jobs and checkpoints in --data-dir), "etcd" (several job managers elect a leader in etcd at --etcd-endpoints) or "embedded" (etcd run inside this job manager, for development)`)
	fl.StringSliceVar(&f.endpoints, "etcd-endpoints", nil, "etcd client URLs, comma-separated (--ha etcd)")
	fl.StringVar(&f.cluster, "ha-cluster-id", "default", "name of the cluster in etcd: job managers with the same id form one cluster; clusters sharing an etcd never see each other's jobs")
	fl.StringVar(&f.advertise, "advertise-address", "", "control-plane address the leader announces to task managers and clients (default: the --listen address bound)")
	fl.DurationVar(&f.leaseTTL, "ha-lease-ttl", 15*time.Second, "time-to-live of the leader's etcd lease (whole seconds, at least 2s; anything else is refused): a crashed leader is replaced after it; a leader cut off from etcd steps down after half of it")
	fl.StringVar(&f.cacert, "etcd-cacert", "", "PEM CA bundle that verifies etcd's certificate (connects over TLS)")
	fl.StringVar(&f.cert, "etcd-cert", "", "PEM client certificate for etcd (with --etcd-key)")
	fl.StringVar(&f.key, "etcd-key", "", "PEM private key of --etcd-cert")
	fl.StringVar(&f.username, "etcd-username", "", "etcd user (role-based access control; with --etcd-password-file)")
	fl.StringVar(&f.passwordFile, "etcd-password-file", "", "file holding the password of --etcd-username")
}

// errHAFlags is wrapped by a refusal of the HA flags.
var errHAFlags = errors.New("high availability")

// etcdTLS is the TLS configuration of the etcd client (nil: plaintext).
func (f *haFlags) etcdTLS() (*tls.Config, error) {
	if f.cacert == "" && f.cert == "" && f.key == "" {
		return nil, nil
	}
	if (f.cert == "") != (f.key == "") {
		return nil, errors.New("--etcd-cert and --etcd-key go together")
	}
	t, err := rpc.ClientTLS(f.cacert)
	if err != nil {
		return nil, fmt.Errorf("--etcd-cacert: %w", err)
	}
	if f.cert != "" {
		c, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return nil, fmt.Errorf("--etcd-cert: %w", err)
		}
		t.Certificates = []tls.Certificate{c}
	}
	return t, nil
}

// open checks the flags and, for --ha etcd or embedded, connects to etcd
// (starting the embedded one) and opens the checkpoint storage: the job
// manager's options, and what to close after it stopped.
func (f *haFlags) open(ctx context.Context, cmd *cobra.Command, log *zap.Logger, dataDir string) ([]jobmanager.Opt, func(), error) {
	none := func() {}
	switch f.mode {
	case "standalone":
		for _, name := range []string{"etcd-endpoints", "ha-cluster-id", "etcd-cacert", "etcd-cert", "etcd-key", "etcd-username", "etcd-password-file", "advertise-address", "ha-lease-ttl"} {
			if cmd.Flags().Changed(name) {
				return nil, none, flagError(cmd, fmt.Errorf("%w: --%s needs --ha etcd or embedded", errHAFlags, name))
			}
		}
		return nil, none, nil
	case "etcd":
		if len(f.endpoints) == 0 {
			return nil, none, flagError(cmd, fmt.Errorf("%w: --ha etcd needs --etcd-endpoints", errHAFlags))
		}
	case "embedded":
		if len(f.endpoints) > 0 {
			return nil, none, flagError(cmd, fmt.Errorf("%w: --ha embedded runs its own etcd: drop --etcd-endpoints (or use --ha etcd)", errHAFlags))
		}
	default:
		return nil, none, flagError(cmd, fmt.Errorf("%w: --ha %q: want standalone, etcd or embedded", errHAFlags, f.mode))
	}
	// etcd grants leases in whole seconds: refused rather than rounded, so
	// that the failover takes the time the operator asked for.
	if f.leaseTTL < 2*time.Second || f.leaseTTL%time.Second != 0 {
		return nil, none, flagError(cmd, fmt.Errorf("%w: --ha-lease-ttl %v: want whole seconds, at least 2s (etcd leases count in seconds)", errHAFlags, f.leaseTTL))
	}
	if f.storageURL == "" {
		return nil, none, flagError(cmd, fmt.Errorf("%w: --ha %s needs --checkpoint-storage: every job manager of the cluster must reach the completed checkpoints' metadata (file:///shared/dir, s3://bucket/prefix)", errHAFlags, f.mode))
	}
	tlsCfg, err := f.etcdTLS()
	if err != nil {
		return nil, none, flagError(cmd, err)
	}
	opts := []ha.Opt{ha.LeaseTTL(f.leaseTTL), ha.Logger(zap.NewNop())}
	if tlsCfg != nil {
		opts = append(opts, ha.TLS(tlsCfg))
	}
	if f.username != "" || f.passwordFile != "" {
		if f.username == "" || f.passwordFile == "" {
			return nil, none, flagError(cmd, errors.New("--etcd-username and --etcd-password-file go together"))
		}
		b, err := os.ReadFile(f.passwordFile)
		if err != nil {
			return nil, none, flagError(cmd, fmt.Errorf("--etcd-password-file: %w", err))
		}
		opts = append(opts, ha.Auth(f.username, strings.TrimRight(string(b), "\r\n")))
	}
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	endpoints := f.endpoints
	if f.mode == "embedded" {
		dir := ""
		if dataDir != "" {
			dir = filepath.Join(dataDir, "etcd")
		} else if dir, err = os.MkdirTemp("", "weir-etcd-"); err != nil {
			return nil, none, err
		} else {
			closers = append(closers, func() { os.RemoveAll(dir) })
		}
		e, err := ha.StartEmbedded(ctx, dir)
		if err != nil {
			closeAll()
			return nil, none, err
		}
		closers = append(closers, e.Close)
		endpoints = e.Endpoints()
		log.Info("embedded etcd started", zap.Strings("endpoints", endpoints))
	}
	svc, err := ha.New(ctx, endpoints, f.cluster, opts...)
	if err != nil {
		closeAll()
		return nil, none, fmt.Errorf("%w: %w", errHAFlags, err)
	}
	closers = append(closers, func() { svc.Close() })
	st, err := storage.Open(ctx, f.storageURL)
	if err != nil {
		closeAll()
		return nil, none, flagError(cmd, fmt.Errorf("--checkpoint-storage: %w", err))
	}
	closers = append(closers, func() { st.Close() })
	jopts := []jobmanager.Opt{jobmanager.HighAvailability(svc, st)}
	if f.advertise != "" {
		jopts = append(jopts, jobmanager.Advertise(f.advertise))
	}
	log.Info("high availability", zap.String("mode", f.mode), zap.Strings("etcd", endpoints), zap.String("cluster", f.cluster),
		zap.String("checkpoint_storage", f.storageURL))
	return jopts, closeAll, nil
}

// localHA starts the embedded etcd of `local --ha embedded` (under
// dataDir/etcd, or a temporary directory) and returns, for each of n job
// managers, what makes its options (its own etcd connection, the shared
// checkpoint storage: storageURL opened with storageOpts, else
// dataDir/checkpoints, or one in-memory store), and what closes everything
// after the job managers stopped.
func localHA(ctx context.Context, log *zap.Logger, dataDir string, n int, storageURL string, storageOpts []storage.Opt) ([]func() ([]jobmanager.Opt, error), func(), error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	etcdDir, defaultURL := "", "mem://local"
	if dataDir != "" {
		abs, err := filepath.Abs(dataDir)
		if err != nil {
			return nil, nil, err
		}
		etcdDir, defaultURL = filepath.Join(abs, "etcd"), "file://"+filepath.Join(abs, "checkpoints")
	} else {
		dir, err := os.MkdirTemp("", "weir-etcd-")
		if err != nil {
			return nil, nil, err
		}
		etcdDir = dir
		closers = append(closers, func() { os.RemoveAll(dir) })
	}
	e, err := ha.StartEmbedded(ctx, etcdDir)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	closers = append(closers, e.Close)
	if storageURL == "" {
		storageURL, storageOpts = defaultURL, nil
	}
	st, err := storage.Open(ctx, storageURL, storageOpts...)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	closers = append(closers, func() { st.Close() })
	log.Info("high availability: embedded etcd", zap.Strings("endpoints", e.Endpoints()), zap.String("checkpoint_storage", storageURL),
		zap.Int("job_managers", n))
	opts := make([]func() ([]jobmanager.Opt, error), n)
	for i := range opts {
		opts[i] = func() ([]jobmanager.Opt, error) {
			svc, err := ha.New(ctx, e.Endpoints(), "local", ha.Logger(zap.NewNop()))
			if err != nil {
				return nil, err
			}
			closers = append(closers, func() { svc.Close() })
			return []jobmanager.Opt{jobmanager.HighAvailability(svc, st)}, nil
		}
	}
	return opts, closeAll, nil
}
