package taskmanager

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/runtime"
)

// Opt configures a task manager.
type Opt interface{ apply(*cfg) }

type optFunc func(*cfg)

func (f optFunc) apply(c *cfg) { f(c) }

type cfg struct {
	id           string
	slots        int
	dataHost     string
	dataOpts     []DataOpt // ports, advertised host; TLS, added by Run from dataTLS
	advertise    string
	window       int
	reconnect    time.Duration
	log          *zap.Logger
	onRegistered func(session uint64)
	jobs         *runtime.Registry
	fp           runtime.Failpointer
	dial         []rpc.DialOpt
	dataTLS      bool           // the data plane runs over TLS (as the control plane)
	dataRejects  *rpc.RejectLog // refused data-plane connections, for every deployment
	metrics      prometheus.Registerer
	cur          *current // the running session's deployments, for metrics
	fence        fence    // the highest leader token seen, across sessions
	storageURL   string   // --checkpoint-storage: wins over the job manager's URL
	storageOpts  []storage.Opt
	storages     *storages // opened checkpoint storages, by URL
	stateBudget  int64     // StateMemory (0: runtime.DefaultStateMemory())
	stateDir     string    // StateDir ("": a temporary directory)
	stateMem     *runtime.StateMemory
}

// ErrDeposedLeader is wrapped by the error that ends a session with a job
// manager whose fencing token is below the highest the task manager has
// seen: a leader that was deposed and does not know it yet.
var ErrDeposedLeader = errors.New("deposed job manager")

// fence keeps the highest fencing token a task manager has seen on control
// messages (a highly available job manager's leadership; 0 standalone).
type fence struct{ highest atomic.Int64 }

// admit accepts a message carrying token unless a later leader's token
// was seen, and raises the highest to token.
func (f *fence) admit(token int64) error {
	for {
		h := f.highest.Load()
		if token < h {
			return fmt.Errorf("%w: its messages carry leader token %d, a later leader's is %d", ErrDeposedLeader, token, h)
		}
		if token == h || f.highest.CompareAndSwap(h, token) {
			return nil
		}
	}
}

// ID sets the task manager's id (default "tm").
func ID(id string) Opt { return optFunc(func(c *cfg) { c.id = id }) }

// Slots sets how many slots the task manager offers (default 2).
func Slots(n int) Opt { return optFunc(func(c *cfg) { c.slots = n }) }

// StateMemory sets the memory budget in bytes of the pebble state backend,
// shared by every task of the task manager (default
// runtime.DefaultStateMemory()); see runtime.StateMemory.
func StateMemory(bytes int64) Opt { return optFunc(func(c *cfg) { c.stateBudget = bytes }) }

// StateDir sets the directory of the pebble state backend's instances
// (default: a temporary directory removed when Run returns).
func StateDir(dir string) Opt { return optFunc(func(c *cfg) { c.stateDir = dir }) }

// DataHost sets the host (name or IP) on which the task manager receives
// records from other task managers, and which it announces to the job
// manager (default 127.0.0.1). Each deployment listens on a port of its own
// there.
func DataHost(h string) Opt { return optFunc(func(c *cfg) { c.dataHost = h }) }

// DataPorts makes each deployment listen on the first free port from lo to
// hi (inclusive) of DataHost instead of any free port (see ListenPorts).
func DataPorts(lo, hi int) Opt {
	return optFunc(func(c *cfg) { c.dataOpts = append(c.dataOpts, ListenPorts(lo, hi)) })
}

// DataAdvertise makes the task manager announce host, instead of DataHost,
// as where its deployments receive records, with the port each listens on
// (see AdvertiseHost): for a NAT or a proxy that forwards the same ports.
func DataAdvertise(host string) Opt {
	return optFunc(func(c *cfg) {
		c.advertise = host
		c.dataOpts = append(c.dataOpts, AdvertiseHost(host))
	})
}

// CreditWindow sets how many data frames a sender may have in flight per
// channel before the receiver returns credit (default 16).
func CreditWindow(n int) Opt { return optFunc(func(c *cfg) { c.window = n }) }

// Jobs sets the job types the task manager can run: the job manager deploys
// tasks by job type name and parameters, and every node must register the
// same types (run the same binary).
func Jobs(r *runtime.Registry) Opt { return optFunc(func(c *cfg) { c.jobs = r }) }

// TLS dials the job manager over TLS with t (default: plaintext). The data
// plane between task managers then runs over TLS too (DataTLS, with a
// certificate the task manager makes itself at start).
func TLS(t *tls.Config) Opt {
	return optFunc(func(c *cfg) { c.dial = append(c.dial, rpc.WithTLS(t)); c.dataTLS = true })
}

// AuthToken sends token with every call to the job manager (its
// --auth-token-file).
func AuthToken(token string) Opt {
	return optFunc(func(c *cfg) { c.dial = append(c.dial, rpc.WithToken(token)) })
}

// Failpoints injects faults into the tasks the task manager runs (nil:
// none).
func Failpoints(fp runtime.Failpointer) Opt { return optFunc(func(c *cfg) { c.fp = fp }) }

// ReconnectDelay sets the pause before reconnecting after a lost session
// (default 500ms).
func ReconnectDelay(d time.Duration) Opt { return optFunc(func(c *cfg) { c.reconnect = d }) }

// Logger sets the logger (default: none).
func Logger(l *zap.Logger) Opt { return optFunc(func(c *cfg) { c.log = l }) }

// CheckpointStorage makes the task manager write task state to, and read
// it from, the checkpoint storage at rawURL (storage.Open; opts configure
// it) instead of the URL the job manager sends with each deployment: for a
// task manager that reaches the same store another way (another endpoint,
// a mount at another path). By default it opens the job manager's URL, and
// without one state travels inline in the acknowledgements.
func CheckpointStorage(rawURL string, opts ...storage.Opt) Opt {
	return optFunc(func(c *cfg) { c.storageURL, c.storageOpts = rawURL, opts })
}

// OnRegistered calls fn after each successful registration (for tests and
// readiness output).
func OnRegistered(fn func(session uint64)) Opt { return optFunc(func(c *cfg) { c.onRegistered = fn }) }

// storages are the checkpoint storages a task manager opened, by URL, kept
// open for its life.
type storages struct {
	opts []storage.Opt
	mu   sync.Mutex
	m    map[string]storage.Storage
}

func (s *storages) open(ctx context.Context, rawURL string) (storage.Storage, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.m[rawURL]; ok {
		return st, nil
	}
	st, err := storage.Open(ctx, rawURL, s.opts...)
	if err != nil {
		return nil, err
	}
	s.m[rawURL] = st
	return st, nil
}

func (s *storages) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.m {
		_ = st.Close()
	}
	clear(s.m)
}

// announcedHost is the data host the job manager is told.
func (c *cfg) announcedHost() string {
	if c.advertise != "" {
		return c.advertise
	}
	return c.dataHost
}

// Run keeps a session with the job manager at addr until ctx is done: it
// registers, heartbeats, and when the session is lost (the job manager is
// gone, restarted or silent beyond the timeout it announced) reconnects by
// itself. addr may list several job managers, comma-separated (those of a
// highly available cluster): before each session the task manager asks
// them who leads (the Leader call) and registers with the leader. It
// refuses the messages of a job manager whose fencing token is below the
// highest it has seen (ErrDeposedLeader) and finds the leader again. It
// returns ctx's error, or a configuration error at once.
func Run(ctx context.Context, addr string, opts ...Opt) error {
	c := cfg{id: "tm", slots: 2, dataHost: "127.0.0.1", window: 16, reconnect: 500 * time.Millisecond, log: zap.NewNop(),
		cur: &current{}}
	for _, o := range opts {
		o.apply(&c)
	}
	if c.slots < 1 {
		return fmt.Errorf("--slots %d must be at least 1", c.slots)
	}
	if c.window < 1 {
		return fmt.Errorf("credit window %d must be at least 1", c.window)
	}
	if c.jobs == nil {
		c.jobs = runtime.NewRegistry()
	}
	memOpts := []runtime.StateMemoryOpt{runtime.StateMemoryBudget(c.stateBudget), runtime.StateSlots(c.slots),
		runtime.StateLogger(c.log.Named("state"))}
	if c.stateDir != "" {
		memOpts = append(memOpts, runtime.StateDir(c.stateDir))
	}
	mem, err := runtime.NewStateMemory(memOpts...)
	if err != nil {
		return fmt.Errorf("--state-memory: %w", err)
	}
	defer mem.Close()
	c.stateMem = mem
	c.dataRejects = rpc.NewRejectLog(c.log, refusalLogInterval)
	c.storages = &storages{opts: c.storageOpts, m: map[string]storage.Storage{}}
	defer c.storages.close()
	if c.storageURL != "" {
		if _, err := c.storages.open(ctx, c.storageURL); err != nil {
			return fmt.Errorf("--checkpoint-storage: %w", err)
		}
	}
	if c.dataTLS {
		cert, err := NewDataCertificate()
		if err != nil {
			return err
		}
		c.dataOpts = append(c.dataOpts, DataTLS(cert))
	}
	if c.metrics != nil {
		col := newCollector(&c, c.cur)
		if err := c.metrics.Register(col); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		defer c.metrics.Unregister(col)
	}
	jms, err := rpc.DialAll(addr, c.dial...)
	if err != nil {
		return err
	}
	defer jms.Close()
	var authDelay time.Duration // the last pause, while the token is refused
	var out outage              // the attempts since the last session that registered
	for {
		target, client, err := jms.Leader(ctx)
		registered := false
		if err == nil {
			registered, err = session(ctx, client, &c)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if registered {
			out = outage{}
		}
		delay := reconnectDelay(authDelay, c.reconnect, err)
		authDelay = 0
		if status.Code(err) == codes.Unauthenticated {
			authDelay = delay
			c.log.Warn("job manager refused the auth token; retrying with backoff (check --auth-token-file)",
				zap.String("job_manager", target), zap.Duration("delay", delay), zap.Error(err))
		} else {
			out.failed(c.log, time.Now(), cmp.Or(target, addr), delay, err)
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// outageLogInterval is how often a task manager that keeps failing to
// reach its job manager (a job-manager failover, a job manager down) says
// so again: one warning when the session is lost, then one summary per
// interval instead of one per attempt (every 500 ms).
const outageLogInterval = 10 * time.Second

// outage counts the failed attempts to reach the job manager since the
// last session that registered, and rate-limits their warnings.
type outage struct {
	start, logged time.Time
	attempts      int // failed attempts in all
	quiet         int // failed attempts since the last warning
}

// failed records one more failed attempt (it ended with err, the next
// comes after delay) and logs it: the first at once, the following ones in
// a summary at most every outageLogInterval.
func (o *outage) failed(log *zap.Logger, now time.Time, jm string, delay time.Duration, err error) {
	o.attempts++
	if o.attempts == 1 {
		o.start, o.logged = now, now
		log.Warn("job manager session lost; reconnecting", zap.String("job_manager", jm),
			zap.Duration("delay", delay), zap.Error(err))
		return
	}
	o.quiet++
	if now.Sub(o.logged) < outageLogInterval {
		log.Debug("job manager still unreachable", zap.String("job_manager", jm), zap.Error(err))
		return
	}
	log.Warn("still reconnecting to the job manager", zap.String("job_manager", jm),
		zap.Int("attempts", o.attempts), zap.Int("attempts_since_last_logged", o.quiet),
		zap.Duration("for", now.Sub(o.start).Round(time.Millisecond)), zap.Duration("delay", delay), zap.Error(err))
	o.logged, o.quiet = now, 0
}

// maxAuthBackoff caps the pause between attempts the job manager refuses
// for their token.
const maxAuthBackoff = 30 * time.Second

// reconnectDelay is the pause before the next session after one that ended
// with err: base, except that while the job manager refuses the token
// (retrying will not help until an operator acts) it doubles at each
// refusal after the first, from base up to maxAuthBackoff; prev is the
// pause after the previous refusal in a row (0: none).
func reconnectDelay(prev, base time.Duration, err error) time.Duration {
	if status.Code(err) != codes.Unauthenticated || prev == 0 {
		return base
	}
	return min(2*prev, max(maxAuthBackoff, base))
}

// session runs one registration until it is lost; registered says
// whether the job manager took the registration.
func session(parent context.Context, client weirpb.JobManagerClient, c *cfg) (registered bool, err error) {
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	// The stream outlives parent just long enough to say goodbye when the
	// task manager stops (parent done): the job manager then logs a stop,
	// not a lost task manager. It ends with the session.
	sctx, scancel := context.WithCancel(context.WithoutCancel(parent))
	defer scancel()
	go func() {
		<-ctx.Done()
		if parent.Err() == nil {
			scancel() // the session failed: the stream goes with it at once
		}
	}()
	st, err := client.Connect(sctx)
	if err != nil {
		return false, fmt.Errorf("%w: %w", rpc.ErrUnreachable, err)
	}
	if err := st.Send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Register{Register: &weirpb.Register{
		TaskManagerId: c.id, Slots: int32(c.slots), DataHost: c.announcedHost()}}}); err != nil {
		if errors.Is(err, io.EOF) { // the stream ended (a refused token, say): Recv has why
			if _, rerr := st.Recv(); rerr != nil {
				err = rerr
			}
		}
		return false, fmt.Errorf("register: %w", err)
	}
	first, err := st.Recv()
	if err != nil {
		return false, fmt.Errorf("register: %w", err)
	}
	reg := first.GetRegistered()
	if reg == nil {
		return false, fmt.Errorf("the job manager answered the registration with %v", first)
	}
	if err := c.fence.admit(first.LeaderToken); err != nil {
		return false, fmt.Errorf("register: %w", err)
	}
	interval := time.Duration(reg.HeartbeatIntervalMs) * time.Millisecond
	timeout := time.Duration(reg.HeartbeatTimeoutMs) * time.Millisecond
	if interval <= 0 || timeout <= interval {
		return false, fmt.Errorf("the job manager announced heartbeat interval %v, timeout %v", interval, timeout)
	}
	c.log.Info("registered with the job manager", zap.String("task_manager", c.id), zap.Uint64("session", reg.Session))
	if c.onRegistered != nil {
		c.onRegistered(reg.Session)
	}
	live := rpc.NewLiveness()
	var sendMu sync.Mutex
	send := func(m *weirpb.TaskManagerMessage) error {
		if err := rpc.CheckSize(m); err != nil {
			return err
		}
		sendMu.Lock()
		defer sendMu.Unlock()
		return st.Send(m)
	}
	tasks := newDeployments(ctx, c, send)
	defer tasks.stop()
	c.cur.set(tasks)
	defer c.cur.set(nil)
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		cancel(rpc.Every(ctx, interval, func() error {
			return send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Heartbeat{Heartbeat: &weirpb.Heartbeat{
				SentUnixMs: time.Now().UnixMilli(), Counts: tasks.counts()}}})
		}))
	}()
	go func() {
		defer wg.Done()
		if err := live.Watch(ctx, timeout); errors.Is(err, rpc.ErrPeerDead) {
			cancel(err)
		}
	}()
	// A job manager silent for longer than this may have ended the session
	// (it ends one silent for the timeout; its own last message can be an
	// interval older than the silence it measured): messages arriving after
	// such a silence, queued while this process was stopped or cut off, are
	// of a session it has failed over, and acting on them (a Trigger's
	// pre-commit) would open transactions for an attempt that is over.
	stale := timeout - interval
	go func() {
		defer wg.Done()
		asm := rpc.NewAssembler(0)
		for {
			m, err := st.Recv()
			if err != nil {
				cancel(err)
				return
			}
			if s := live.Silence(); s > stale {
				cancel(fmt.Errorf("%w: silent for %v before its next message (timeout %v, interval %v): the session may have ended there; its queued messages are dropped",
					rpc.ErrPeerDead, s.Round(time.Millisecond), timeout, interval))
				return
			}
			if err := c.fence.admit(m.LeaderToken); err != nil {
				cancel(err)
				return
			}
			live.Seen()
			tasks.receive(asm, m)
		}
	}()
	<-ctx.Done()
	if parent.Err() != nil {
		goodbye(func(m *weirpb.TaskManagerMessage) error {
			// Under the send lock: CloseSend must not run beside a Send
			// (a deployment's last replies).
			sendMu.Lock()
			defer sendMu.Unlock()
			if err := st.Send(m); err != nil {
				return err
			}
			return st.CloseSend()
		}, c.id, context.Cause(parent))
	}
	scancel()
	wg.Wait()
	return true, context.Cause(ctx)
}

// goodbyeTimeout bounds the wait to say goodbye to a job manager that does
// not read.
const goodbyeTimeout = time.Second

// goodbye tells the job manager that the task manager ends the session on
// purpose (why: it is stopping): sendLast sends it and closes the stream's
// sending side.
func goodbye(sendLast func(*weirpb.TaskManagerMessage) error, id string, why error) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		reason := "task manager " + id + " is stopping"
		if why != nil && !errors.Is(why, context.Canceled) {
			reason += ": " + why.Error()
		}
		_ = sendLast(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Goodbye{Goodbye: &weirpb.Goodbye{Reason: reason}}})
	}()
	select {
	case <-done:
	case <-time.After(goodbyeTimeout):
	}
}
