// Package broker owns Weir's embedded Kafka broker: one kfake broker serving
// the real Kafka protocol on a real TCP address, optionally persisted to a
// data directory, started with the defaults Weir uses to develop share-group
// jobs (see DefaultConfigs).
//
// `streamctl broker`, `streamctl local`, `streamctl demo` and the tests (via
// internal/kafkatest) all start it through Start, so they share one set of
// defaults and one set of startup checks.
//
// With a data dir it also owns the repairs that make a crash survivable
// (journal.go, repair.go, share.go, orphans.go, segindex.go): it journals
// what kfake writes only at a clean stop, and after an unclean stop it
// rebuilds that state through the Kafka protocol, on an internal loopback
// listener, before clients are let in.
//
// It must not contain anything a production deployment depends on: it is a
// development and test broker. It must not import any other Weir package, and
// nothing in it may assume a client: clients reach it over the network only
// (its own repair client included). It must not copy or fork kfake: it uses
// kfake's public API (options, control hooks, CreateTopic, SetGroupConfigs)
// and the Kafka protocol only, with one exception: segindex.go rewrites
// kfake's per-segment index files from the segments before kfake loads a
// crashed data dir, because kfake does not reconcile them itself (their
// format is pinned by TestReconcileReproducesKfakesOwnIndexes).
package broker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/weirstream/weir/internal/atomicfile"
)

// Errors returned by Start; match them with errors.Is. The underlying system
// error (for example syscall.EADDRINUSE) is matchable too.
var (
	// ErrListen means the listen address could not be bound.
	ErrListen = errors.New("cannot listen")
	// ErrDataDir means the data directory cannot be created or written.
	ErrDataDir = errors.New("data dir unusable")
	// ErrDataDirLocked means another broker holds the data directory.
	ErrDataDirLocked = errors.New("data dir in use by another broker")
	// ErrInvalidConfig means an option or broker config is invalid.
	ErrInvalidConfig = errors.New("invalid broker config")
	// ErrStart means kfake refused to start, for example on persisted state
	// it cannot load.
	ErrStart = errors.New("cannot start broker")
)

// DefaultListen is the address `streamctl broker` listens on by default.
const DefaultListen = "127.0.0.1:9092"

// DefaultPartitions is the partition count of topics created without one.
const DefaultPartitions = 8

// Opt configures Start.
type Opt interface{ apply(*cfg) }

type opt func(*cfg)

func (o opt) apply(c *cfg) { o(c) }

type cfg struct {
	listen     string
	advertise  string
	dataDir    string
	partitions int
	autoCreate bool
	configs    map[string]string
	logger     *zap.Logger
}

// Listen sets the host:port to bind, overriding the default 127.0.0.1:0 (a
// free port on the loopback interface). The host is bound as given; port 0
// picks a free port, which Addr reports.
func Listen(addr string) Opt { return opt(func(c *cfg) { c.listen = addr }) }

// Advertise sets the host:port the broker tells clients to connect to in
// metadata responses, overriding the bound address. When the bound host is
// unspecified (0.0.0.0 or ::) and this is not set, 127.0.0.1 is advertised:
// set this to a name remote clients can reach. A port of 0 (or none) means
// the bound port.
func Advertise(addr string) Opt { return opt(func(c *cfg) { c.advertise = addr }) }

// DataDir persists the broker's state (records, topics, groups, committed
// offsets, producer ids, committed and pending transactions, share-group
// state) in dir, overriding the default of keeping everything in memory.
// Starting again on the same dir restores the state. The dir is created if
// needed and locked while the broker runs.
func DataDir(dir string) Opt { return opt(func(c *cfg) { c.dataDir = dir }) }

// Partitions sets the partition count of topics created without one (auto
// created, or CreateTopics with -1), overriding DefaultPartitions.
func Partitions(n int) Opt { return opt(func(c *cfg) { c.partitions = n }) }

// AutoCreateTopics sets whether a metadata request that asks for it creates
// a missing topic, overriding the default true (Apache Kafka's default:
// kcat and most clients can produce to a new topic at once). Clients still
// have to ask: franz-go does only with kgo.AllowAutoTopicCreation.
func AutoCreateTopics(enabled bool) Opt { return opt(func(c *cfg) { c.autoCreate = enabled }) }

// Config sets one broker config, overriding its default (DefaultConfigs) or
// kfake's. An empty value resets the key to kfake's default. Unknown keys and
// non-integer values of integer keys make Start fail with ErrInvalidConfig.
// Configs given here win over configs persisted in the data dir.
func Config(key, value string) Opt {
	return opt(func(c *cfg) { c.configs[key] = value })
}

// Logger sets the logger for the broker's own messages, overriding a no-op
// logger. kfake's error and warning messages go to it at the same level, its
// informational chatter at debug.
func Logger(l *zap.Logger) Opt { return opt(func(c *cfg) { c.logger = l }) }

// Broker is a running embedded broker. Close it when done.
type Broker struct {
	cluster *kfake.Cluster
	addr    string
	bound   string
	dataDir string
	log     *zap.Logger
	kfl     *kfakeLogger
	unlock  func() error

	repair   Repair
	repairer *repairer   // nil without a data dir
	internal *kgo.Client // the repairer's client, nil without a data dir

	closeOnce sync.Once
	closeErr  error
}

// Start starts one broker and returns once it accepts connections. The
// context bounds only the start; the broker runs until Close.
func Start(ctx context.Context, opts ...Opt) (*Broker, error) {
	c := cfg{
		listen:     "127.0.0.1:0",
		partitions: DefaultPartitions,
		autoCreate: true,
		configs:    defaultConfigMap(),
		logger:     zap.NewNop(),
	}
	for _, o := range opts {
		o.apply(&c)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStart, err)
	}
	if c.partitions < 1 {
		return nil, fmt.Errorf("%w: partitions must be at least 1, got %d", ErrInvalidConfig, c.partitions)
	}
	if c.logger == nil {
		c.logger = zap.NewNop()
	}
	if err := validateConfigs(c.configs); err != nil {
		return nil, err
	}

	var unlock func() error
	if c.dataDir != "" {
		dir, err := filepath.Abs(c.dataDir)
		if err != nil {
			return nil, &startError{kind: ErrDataDir, msg: fmt.Sprintf("data dir %s: %s", c.dataDir, short(err)), err: err}
		}
		c.dataDir = dir
		if unlock, err = prepareDataDir(dir); err != nil {
			return nil, err
		}
	}
	fail := func(err error) (*Broker, error) {
		if unlock != nil {
			_ = unlock()
		}
		return nil, err
	}

	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return fail(&startError{kind: ErrListen, msg: fmt.Sprintf("cannot listen on %s: %s", c.listen, short(err)), err: err})
	}
	advertised, err := advertisedAddr(ln.Addr(), c.advertise)
	if err != nil {
		ln.Close()
		return fail(err)
	}
	// kfake advertises its listener's Addr in metadata; report the address
	// clients must dial instead of, say, 0.0.0.0.
	aln := &advertisedListener{Listener: ln, addr: advertised}
	iln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		ln.Close()
		return fail(&startError{kind: ErrListen, msg: fmt.Sprintf("cannot listen on an internal loopback port: %s", short(err)), err: err})
	}
	gate := newGatedListener(aln, iln)
	handedOut := false
	listenFn := func(string, string) (net.Listener, error) {
		if handedOut {
			return nil, errors.New("embedded broker supports exactly one listener")
		}
		handedOut = true
		return gate, nil
	}

	kfl := &kfakeLogger{log: c.logger.Named("kfake")}
	kopts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.ListenFn(listenFn),
		kfake.DefaultNumPartitions(c.partitions),
		kfake.BrokerConfigs(c.configs),
		kfake.WithLogger(kfl),
	}
	if c.autoCreate {
		kopts = append(kopts, kfake.AllowAutoTopicCreation())
	}
	if c.dataDir != "" {
		kopts = append(kopts, kfake.DataDir(c.dataDir))
	}
	var unclean bool
	if c.dataDir != "" {
		_, err := os.Stat(filepath.Join(c.dataDir, runningFile))
		unclean = err == nil
	}
	var indexes []string
	if unclean {
		// Before kfake loads the dir (segindex.go).
		if indexes, err = reconcileSegmentIndexes(c.dataDir); err != nil {
			gate.Close()
			return fail(&startError{kind: ErrStart, msg: fmt.Sprintf("cannot repair data dir %s after an unclean stop: %s", c.dataDir, err), err: err})
		}
	}
	cluster, err := newCluster(kopts)
	if err != nil {
		gate.Close() // kfake closes it too on most paths; closing twice is harmless
		return fail(&startError{kind: ErrStart, msg: fmt.Sprintf("cannot start broker: %s", err), err: err})
	}
	b := &Broker{
		cluster: cluster,
		addr:    advertised,
		bound:   ln.Addr().String(),
		dataDir: c.dataDir,
		log:     c.logger,
		kfl:     kfl,
		unlock:  unlock,
	}
	if c.dataDir != "" {
		if err := b.startRepairs(ctx, gate, &c, unclean, indexes); err != nil {
			cluster.Close()
			return fail(err)
		}
	}
	gate.open()
	b.log.Info("embedded broker started",
		zap.String("listen", ln.Addr().String()),
		zap.String("advertised", b.addr),
		zap.String("data_dir", c.dataDir),
		zap.Int("default_partitions", c.partitions),
		zap.Bool("auto_create_topics", c.autoCreate),
		zap.Any("configs", c.configs),
	)
	return b, nil
}

// startRepairs installs the journal hooks, re-applies journaled group
// configs, repairs what a crash of the previous run lost (unclean; indexes
// are the segment indexes rebuilt before kfake loaded the dir), marks the
// dir as in use and starts the journaler.
func (b *Broker) startRepairs(ctx context.Context, gate *gatedListener, c *cfg, unclean bool, indexes []string) error {
	cl, err := gate.internalClient()
	if err != nil {
		return &startError{kind: ErrStart, msg: fmt.Sprintf("cannot start broker: internal client: %s", err), err: err}
	}
	r, err := newRepairer(c.dataDir, cl, b.log)
	if err != nil {
		cl.Close()
		return err
	}
	r.install(b.cluster, c.autoCreate)
	rep := Repair{Unclean: unclean, SegmentIndexes: indexes, GroupConfigs: r.reapplyGroupConfigs(b.cluster)}
	if unclean {
		if err := b.repairCrash(ctx, r, c, &rep); err != nil {
			cl.Close()
			return &startError{kind: ErrStart, msg: fmt.Sprintf("cannot repair data dir %s after an unclean stop: %s", c.dataDir, err), err: err}
		}
	}
	if err := atomicfile.Write(filepath.Join(c.dataDir, runningFile), []byte(strconv.Itoa(os.Getpid())+"\n")); err != nil {
		cl.Close()
		return &startError{kind: ErrDataDir, msg: fmt.Sprintf("data dir %s: %s", c.dataDir, short(err)), err: err}
	}
	b.repair, b.repairer, b.internal = rep, r, cl
	go r.run()
	return nil
}

// repairCrash repairs what a crash of the previous broker on the dir lost,
// and logs it at WARN.
func (b *Broker) repairCrash(ctx context.Context, r *repairer, c *cfg, rep *Repair) error {
	began := time.Now()
	orphans, lost, err := findOrphans(ctx, r.cl)
	if err != nil {
		return err
	}
	if rep.FencedProducers, err = fenceOrphans(ctx, r.cl, orphans, lost); err != nil {
		return err
	}
	if err := writeMarkers(ctx, r.cl, orphans, false); err != nil {
		return err
	}
	rep.AbortedTxns = orphans
	rep.ShareGroups, rep.ShareRecordsRedelivered, err = r.repairShareGroups(ctx, c.configs["group.share.partition.max.record.locks"])
	if err != nil {
		return err
	}
	txns := make([]string, 0, len(orphans))
	for _, o := range orphans {
		txns = append(txns, fmt.Sprintf("producer %d epoch %d on %s (first record %s)", o.ProducerID, o.Epoch, partitionsOf(o.FirstOffsets), o.FirstRecord.UTC().Format(time.RFC3339Nano)))
	}
	b.log.Warn("embedded broker: the previous run on this data dir did not stop cleanly; repaired what kfake does not persist as it goes",
		zap.String("data_dir", c.dataDir),
		zap.Strings("segment_indexes_rebuilt", rep.SegmentIndexes),
		zap.Strings("group_configs_reapplied", rep.GroupConfigs),
		zap.Strings("share_groups_rebuilt", rep.ShareGroups),
		zap.Int64("share_records_redelivered", rep.ShareRecordsRedelivered),
		zap.Strings("open_transactions_aborted", txns),
		zap.Strings("producers_fenced", rep.FencedProducers),
		zap.String("topics", "auto-created topics are persisted as they are created; records are kept per batch"),
		zap.Duration("took", time.Since(began)),
	)
	return nil
}

func partitionsOf(m map[string]map[int32]int64) string {
	var parts []string
	for _, t := range slices.Sorted(maps.Keys(m)) {
		for _, p := range slices.Sorted(maps.Keys(m[t])) {
			parts = append(parts, fmt.Sprintf("%s/%d", t, p))
		}
	}
	return strings.Join(parts, ",")
}

// newCluster runs kfake.NewCluster, turning a panic into an error: no panic
// may escape to users.
func newCluster(opts []kfake.Opt) (c *kfake.Cluster, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("kfake panicked: %v", r)
		}
	}()
	return kfake.NewCluster(opts...)
}

// Bound returns the address the broker's listener is bound to (for
// "0.0.0.0:0", the port chosen); Addr is what clients are told.
func (b *Broker) Bound() string { return b.bound }

// Addr returns the host:port clients connect to (the advertised address).
func (b *Broker) Addr() string { return b.addr }

// DataDir returns the absolute data directory, or "" for an in-memory broker.
func (b *Broker) DataDir() string { return b.dataDir }

// Cluster returns the underlying kfake cluster, for tests that inject faults
// (kfake's ControlKey, Fault). Do not Close it directly: use Close.
func (b *Broker) Cluster() *kfake.Cluster { return b.cluster }

// Close stops the broker: it stops accepting connections, drops the open
// ones, persists all state to the data dir (if any) and releases the data dir.
// It returns an error if persisting failed. Close is safe to call more than
// once; later calls return the first result.
func (b *Broker) Close() error {
	b.closeOnce.Do(func() {
		if b.repairer != nil {
			b.repairer.close()
			b.internal.Close()
		}
		b.kfl.startCapture()
		b.cluster.Close()
		errs := b.kfl.stopCapture()
		if b.repairer != nil && len(errs) == 0 {
			// Everything was written: the next start is a clean one.
			if err := os.Remove(filepath.Join(b.dataDir, runningFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove %s: %w", runningFile, err))
			}
		}
		if b.unlock != nil {
			if err := b.unlock(); err != nil {
				errs = append(errs, fmt.Errorf("release data dir lock: %w", err))
			}
		}
		if len(errs) > 0 {
			b.closeErr = fmt.Errorf("broker close: %w", errors.Join(errs...))
		}
		b.log.Info("embedded broker stopped", zap.String("addr", b.addr), zap.Error(b.closeErr))
	})
	return b.closeErr
}

// prepareDataDir creates dir, proves it writable, and locks it.
func prepareDataDir(dir string) (unlock func() error, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, &startError{kind: ErrDataDir, msg: fmt.Sprintf("data dir %s cannot be created: %s", dir, short(err)), err: err}
	}
	probe, err := os.CreateTemp(dir, ".weir-write-probe-*")
	if err == nil {
		_, err = probe.Write([]byte("probe"))
		if cerr := probe.Close(); err == nil {
			err = cerr
		}
		if rerr := os.Remove(probe.Name()); err == nil {
			err = rerr
		}
	}
	if err != nil {
		return nil, &startError{kind: ErrDataDir, msg: fmt.Sprintf("data dir %s is not writable: %s", dir, short(err)), err: err}
	}
	unlock, err = lockDir(dir)
	if err != nil {
		if errors.Is(err, errLocked) {
			return nil, &startError{kind: ErrDataDirLocked, msg: fmt.Sprintf("data dir %s is in use by another broker", dir), err: err}
		}
		return nil, &startError{kind: ErrDataDir, msg: fmt.Sprintf("data dir %s cannot be locked: %s", dir, short(err)), err: err}
	}
	return unlock, nil
}

// advertisedAddr computes the host:port reported to clients.
func advertisedAddr(bound net.Addr, advertise string) (string, error) {
	tcp, ok := bound.(*net.TCPAddr)
	if !ok {
		return "", fmt.Errorf("%w: listener address %v is not TCP", ErrListen, bound)
	}
	if advertise == "" {
		host := tcp.IP.String()
		if tcp.IP == nil || tcp.IP.IsUnspecified() {
			host = "127.0.0.1"
		}
		return net.JoinHostPort(host, strconv.Itoa(tcp.Port)), nil
	}
	host, port, err := net.SplitHostPort(advertise)
	if err != nil {
		host, port = advertise, ""
	}
	if host == "" {
		return "", fmt.Errorf("%w: advertised address %q has no host", ErrInvalidConfig, advertise)
	}
	p := tcp.Port
	if port != "" && port != "0" {
		if p, err = strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return "", fmt.Errorf("%w: advertised address %q has a bad port", ErrInvalidConfig, advertise)
		}
	}
	return net.JoinHostPort(host, strconv.Itoa(p)), nil
}

// advertisedListener reports the advertised address as its own: kfake puts
// its listener's address in metadata responses.
type advertisedListener struct {
	net.Listener
	addr string
}

func (l *advertisedListener) Addr() net.Addr { return advertised(l.addr) }

// advertised is a host:port whose host may be a name.
type advertised string

func (advertised) Network() string  { return "tcp" }
func (a advertised) String() string { return string(a) }

// startError carries a one-line message and two causes: the Weir sentinel
// (kind) and the system error.
type startError struct {
	kind error
	msg  string
	err  error
}

func (e *startError) Error() string   { return e.msg }
func (e *startError) Unwrap() []error { return []error{e.kind, e.err} }

// short returns the innermost system error text ("address already in use"),
// or err's own text.
func short(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return err.Error()
}

// kfakeLogger adapts kfake's logger to zap and, during Close, captures
// error-level messages so Close can return them.
type kfakeLogger struct {
	log *zap.Logger

	mu        sync.Mutex
	capturing bool
	captured  []error
}

// kfakeSlowEndTxn begins kfake's warning about an EndTxn that took over
// 5 ms: timing telemetry of a loaded machine, not a problem, so it is
// logged at debug level.
const kfakeSlowEndTxn = "txn: EndTxn slow "

func (l *kfakeLogger) Logf(level kfake.LogLevel, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	switch {
	case level == kfake.LogLevelError:
		l.log.Error(msg)
		l.mu.Lock()
		if l.capturing {
			l.captured = append(l.captured, errors.New(msg))
		}
		l.mu.Unlock()
	case level == kfake.LogLevelWarn && !strings.HasPrefix(format, kfakeSlowEndTxn):
		l.log.Warn(msg)
	default:
		l.log.Debug(msg)
	}
}

func (l *kfakeLogger) startCapture() {
	l.mu.Lock()
	l.capturing = true
	l.mu.Unlock()
}

func (l *kfakeLogger) stopCapture() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.capturing = false
	errs := l.captured
	l.captured = nil
	return errs
}
