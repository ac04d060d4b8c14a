package jobmanager

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/jobmanager/ha"
	"github.com/weirstream/weir/runtime"
)

// TaskManager is a registered task manager as the job manager sees it.
type TaskManager struct {
	ID    string
	Slots int
	// UsedSlots are the slots the deployed jobs occupy.
	UsedSlots int
	// DataHost is where the task manager's deployments receive records.
	DataHost string
	// Session increases with each registration of the same id.
	Session uint64
	// HeartbeatAge is the time since the task manager was last heard from.
	HeartbeatAge time.Duration
}

// session is one live task-manager session.
type session struct {
	tm   TaskManager // ID, Slots, DataHost, Session; UsedSlots under Server.mu
	send func(*weirpb.JobManagerMessage) error
	live *rpc.Liveness
	// chunker splits the large payloads sent on the session (restored
	// state); log is the job manager's.
	chunker *rpc.Chunker
	log     *zap.Logger
	done    chan struct{} // closed when the session ended
	err     error         // why, once done is closed

	mu     sync.Mutex
	shares map[shareKey]*share

	// goodbye is the reason the task manager gave for ending the session
	// on purpose (nil: it gave none).
	goodbye atomic.Pointer[string]
}

// errStopped is why a session ends whose task manager said goodbye: it
// stopped on purpose (SIGINT/SIGTERM), it was not lost.
var errStopped = errors.New("the task manager stopped")

// Opt configures a Server.
type Opt interface{ apply(*cfg) }

type optFunc func(*cfg)

func (f optFunc) apply(c *cfg) { f(c) }

type cfg struct {
	interval    time.Duration
	timeout     time.Duration
	log         *zap.Logger
	dir         string
	jobs        *runtime.Registry
	fp          runtime.Failpointer
	slotTimeout time.Duration
	tls         *tls.Config
	token       string
	hosts       []string
	// savepointDir is where savepoints go by default ("": nowhere).
	savepointDir string
	// savepointAllowed are the locations clients may name savepoints
	// under besides savepointDir and dir (SavepointAllowedLocations).
	savepointAllowed []string
	// ha makes the job manager highly available (nil: standalone).
	ha        *haCfg
	advertise string
	// storageURL is the checkpoint storage tasks write state to ("":
	// none, state inline); storageOpts configure opening it.
	storageURL  string
	storageOpts []storage.Opt
	inlineLimit int64
	orphanGrace time.Duration
	// cpTimeout is how long a checkpoint may take before it expires.
	cpTimeout time.Duration
	// stateBackend is the state backend of a job submitted without one
	// ("": the heap).
	stateBackend runtime.StateBackendKind
}

// DefaultStateBackend sets the state backend of jobs submitted without
// the reserved parameter runtime.ParamStateBackend (default
// runtime.HeapState); streamctl local --state-backend.
func DefaultStateBackend(k runtime.StateBackendKind) Opt {
	return optFunc(func(c *cfg) { c.stateBackend = k })
}

// CheckpointTimeout sets how long a checkpoint of any job may take from its
// trigger before it expires (Flink's execution.checkpointing.timeout;
// default runtime.DefaultCheckpointTimeout, 1 minute). Jobs with large
// state whose checkpoints take longer need more, or every checkpoint
// expires. Exactly-once Kafka sinks and share-group sources check at open
// that their transaction timeout outlives it.
func CheckpointTimeout(d time.Duration) Opt { return optFunc(func(c *cfg) { c.cpTimeout = d }) }

// CheckpointStorage makes the tasks of every job write their state to the
// checkpoint storage at rawURL (storage.Open: file://, s3://, mem://) and
// acknowledge checkpoints with references to it: the job manager keeps only
// the references in its checkpoint store, tracks which objects the
// retained checkpoints reference, and deletes the others. The URL goes to
// the task managers with each deployment (a task manager started with its
// own --checkpoint-storage uses that). Default: none, state travels inline
// in the acknowledgements and lives in the checkpoint store.
func CheckpointStorage(rawURL string, opts ...storage.Opt) Opt {
	return optFunc(func(c *cfg) { c.storageURL, c.storageOpts = rawURL, opts })
}

// StateInlineLimit sets the task snapshot size below which state stays
// inline even with CheckpointStorage (default 20 KiB; negative: none).
func StateInlineLimit(n int64) Opt { return optFunc(func(c *cfg) { c.inlineLimit = n }) }

// OrphanGrace sets how old an unreferenced object in checkpoint storage
// must be before the orphan sweep deletes it (default
// runtime.DefaultOrphanGrace).
func OrphanGrace(d time.Duration) Opt { return optFunc(func(c *cfg) { c.orphanGrace = d }) }

// HeartbeatInterval sets how often the job manager heartbeats each task
// manager, and asks them to heartbeat it (default rpc.DefaultHeartbeatInterval).
func HeartbeatInterval(d time.Duration) Opt { return optFunc(func(c *cfg) { c.interval = d }) }

// HeartbeatTimeout sets after how long a silent task manager is dead
// (default rpc.DefaultHeartbeatTimeout).
func HeartbeatTimeout(d time.Duration) Opt { return optFunc(func(c *cfg) { c.timeout = d }) }

// storageProbeTimeout bounds the check, at New, that the checkpoint
// storage can be written to.
const storageProbeTimeout = 30 * time.Second

// Logger sets the logger (default: none).
func Logger(l *zap.Logger) Opt { return optFunc(func(c *cfg) { c.log = l }) }

// DataDir keeps the job store and the completed checkpoints in pebble
// stores under dir (default: in memory, lost with the process). A job
// manager started again on the same dir resumes its jobs.
func DataDir(dir string) Opt { return optFunc(func(c *cfg) { c.dir = dir }) }

// Jobs sets the job types that can be submitted; the task managers must
// register the same (run the same binary).
func Jobs(r *runtime.Registry) Opt { return optFunc(func(c *cfg) { c.jobs = r }) }

// Failpoints injects faults into the job master loop of every job (the
// checkpoint driver's jm.* failpoints; nil: none).
func Failpoints(fp runtime.Failpointer) Opt { return optFunc(func(c *cfg) { c.fp = fp }) }

// TLS serves the control plane over TLS with t (default: plaintext).
func TLS(t *tls.Config) Opt { return optFunc(func(c *cfg) { c.tls = t }) }

// AuthToken requires token on every call (default: none; a job manager
// bound beyond loopback must have one, see rpc.CheckExposure).
func AuthToken(token string) Opt { return optFunc(func(c *cfg) { c.token = token }) }

// HTTPHosts are the names the HTTP API answers to, besides loopback names
// (rpc.BrowserGuard): its listen host and the operator's
// --rest-allowed-hosts. A request naming another Host is answered 421.
func HTTPHosts(hosts ...string) Opt {
	return optFunc(func(c *cfg) { c.hosts = append(c.hosts, hosts...) })
}

// SlotTimeout sets how long an attempt waits for enough free slots before
// it fails (default DefaultSlotTimeout).
func SlotTimeout(d time.Duration) Opt { return optFunc(func(c *cfg) { c.slotTimeout = d }) }

// Server is the job manager: its gRPC service runs task-manager sessions
// (registration, heartbeats both ways, death detection) and the client API
// (submit, list, status, cancel, checkpoints), and it runs the submitted
// jobs on the task managers' slots.
type Server struct {
	weirpb.UnimplementedJobManagerServer
	cfg cfg

	mu       sync.Mutex
	tms      map[string]*session
	lost     []LostTaskManager // most recent last, at most maxLost
	sessions uint64
	changed  chan struct{} // closed and replaced on every change (registration, loss, slots)

	jobs    jobs
	metrics *prometheus.Registry
	// stopping is set when Serve stops: the sessions it ends then were not
	// lost by their task managers.
	stopping atomic.Bool
	// rejects logs refused authentication, RPC and HTTP alike.
	rejects *rpc.RejectLog
	// leadership is this job manager's term as leader (high availability;
	// nil: standalone, or not leading yet), advertised the address it
	// announced.
	leadership atomic.Pointer[ha.Leadership]
	advertised string
	// etcdDown is why etcd was unreachable at the last check made while
	// campaigning (nil: it answered, or no check failed yet).
	etcdDown atomic.Pointer[error]
	// storage is the checkpoint storage (nil: none).
	storage storage.Storage
	// savepointRoots are where clients may name savepoint locations.
	savepointRoots []savepointRoot
}

// New opens a job manager's stores (DataDir); Close closes them.
func New(opts ...Opt) (*Server, error) {
	c := cfg{interval: rpc.DefaultHeartbeatInterval, timeout: rpc.DefaultHeartbeatTimeout, log: zap.NewNop(),
		slotTimeout: DefaultSlotTimeout, orphanGrace: runtime.DefaultOrphanGrace, cpTimeout: runtime.DefaultCheckpointTimeout}
	for _, o := range opts {
		o.apply(&c)
	}
	if c.jobs == nil {
		c.jobs = runtime.NewRegistry()
	}
	if c.cpTimeout <= 0 {
		return nil, fmt.Errorf("%w: checkpoint timeout %v must be positive", runtime.ErrInvalidOption, c.cpTimeout)
	}
	if c.interval <= 0 || c.timeout <= c.interval || c.slotTimeout <= 0 {
		return nil, fmt.Errorf("heartbeat interval %v, timeout %v, slot timeout %v: all positive, the timeout above the interval",
			c.interval, c.timeout, c.slotTimeout)
	}
	s := &Server{cfg: c, tms: map[string]*session{}, changed: make(chan struct{}),
		rejects: rpc.NewRejectLog(c.log, rejectLogInterval)}
	s.metrics = newRegistry(s)
	s.jobs.init()
	if c.orphanGrace < 0 {
		return nil, fmt.Errorf("orphan grace %v must not be negative", c.orphanGrace)
	}
	roots, err := savepointRoots(c)
	if err != nil {
		return nil, err
	}
	s.savepointRoots = roots
	if c.storageURL != "" {
		st, err := storage.Open(context.Background(), c.storageURL, c.storageOpts...)
		if err != nil {
			return nil, fmt.Errorf("checkpoint storage: %w", err)
		}
		// A missing bucket or a read-only store is found now, not when
		// the first checkpoint fails.
		pctx, cancel := context.WithTimeout(context.Background(), storageProbeTimeout)
		err = storage.Probe(pctx, st)
		cancel()
		if err != nil {
			st.Close()
			return nil, fmt.Errorf("checkpoint storage %s: %w", c.storageURL, err)
		}
		s.storage = st
	}
	if c.ha != nil {
		return s, nil // the stores open when the job manager leads
	}
	if err := s.jobs.open(c.dir, c.log); err != nil {
		if s.storage != nil {
			s.storage.Close()
		}
		return nil, err
	}
	return s, nil
}

// rejectLogInterval is how often at most a refused authentication is
// logged per client host.
const rejectLogInterval = time.Minute

// Close closes the job manager's stores; call it after Serve returned.
func (s *Server) Close() error {
	err := s.jobs.close()
	if s.storage != nil {
		err = errors.Join(err, s.storage.Close())
	}
	return err
}

// Serve serves the job manager's gRPC service on lis and resumes the jobs
// the store holds, until ctx is done; then it suspends the jobs (for the
// next job manager on the same data directory to resume) and stops. A
// highly available job manager (HighAvailability) first campaigns, serving
// only Leader meanwhile; it resumes the cluster's jobs once it leads,
// resigns when ctx is done, and returns ErrLeadershipLost (its jobs
// suspended) when its leadership ends otherwise.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	gs := grpc.NewServer(append(rpc.ServerOptions(s.cfg.tls, s.cfg.token, rpc.LogRejections(s.rejects)), s.gateOptions()...)...)
	weirpb.RegisterJobManagerServer(gs, s)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	var err error
	if s.cfg.ha != nil {
		err = s.lead(ctx, s.announced(lis.Addr().String()), served)
		s.stopping.Store(true)
		gs.Stop()
		s.jobs.wg.Wait()
		if errors.Is(err, grpc.ErrServerStopped) {
			err = nil
		}
		return err
	}
	if err := s.resume(); err != nil {
		s.cfg.log.Error("resuming jobs", zap.Error(err))
	}
	select {
	case <-ctx.Done():
	case err = <-served:
	}
	s.stopping.Store(true)
	s.suspendAll()
	gs.Stop()
	s.jobs.wg.Wait()
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// TaskManagers lists the live task managers by id.
func (s *Server) TaskManagers() []TaskManager {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]TaskManager, 0, len(s.tms))
	for _, ss := range s.tms {
		tm := ss.tm
		tm.HeartbeatAge = ss.live.Silence()
		out = append(out, tm)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// LostTaskManager is a task manager whose session ended without it
// registering again.
type LostTaskManager struct {
	TaskManager
	// At is when the session ended; Reason says why.
	At     time.Time
	Reason string
}

// endReason says why the session ended ("" while it runs).
func (ss *session) endReason() string {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.err == nil {
		return ""
	}
	return ss.err.Error()
}

// maxLost bounds how many lost task managers the job manager remembers.
const maxLost = 32

// LostTaskManagers lists the task managers that were lost and have not
// registered again since (the most recent maxLost), by id.
func (s *Server) LostTaskManagers() []LostTaskManager {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(s.lost)
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// forgetLostLocked drops id from the lost task managers.
func (s *Server) forgetLostLocked(id string) {
	s.lost = slices.DeleteFunc(s.lost, func(l LostTaskManager) bool { return l.ID == id })
}

// Changed returns a channel closed at the next registration or loss of a
// task manager.
func (s *Server) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// connectionEnded says why a session's stream ended with err (its Recv's
// error, or its context's cause), keeping err wrapped. gRPC reports a peer
// whose socket closed (a SIGKILLed process: the kernel closes it) or whose
// network went away as a canceled stream, io.EOF or Unavailable; the task
// manager sends no goodbye, so this is what an exit or a network loss
// looks like, unless the job manager itself is stopping.
func (s *Server) connectionEnded(err error) error {
	switch {
	case s.stopping.Load():
		return fmt.Errorf("the job manager is stopping: %w", err)
	case errors.Is(err, context.Canceled), errors.Is(err, io.EOF),
		status.Code(err) == codes.Canceled, status.Code(err) == codes.Unavailable:
		return fmt.Errorf("%w (process exited or network lost): %w", errConnectionLost, err)
	}
	return fmt.Errorf("connection closed: %w", err)
}

// errConnectionLost is wrapped by connectionEnded's error for a stream
// that ended without a goodbye.
var errConnectionLost = errors.New("the task manager's connection ended without a goodbye")

// detection says how the end of a session with err (Connect's) was
// detected: a silent task manager by the heartbeat timeout, one that
// stopped by its goodbye, any other end of the stream (closed, reset,
// failed) as the connection's loss.
func detection(err error) Detection {
	switch {
	case errors.Is(err, errSilent):
		return DetectedHeartbeatTimeout
	case errors.Is(err, errStopped):
		return DetectedGoodbye
	}
	return DetectedConnectionLoss
}

// errSilent ends a session whose task manager stopped heartbeating.
var errSilent = errors.New("task manager silent")

// Connect implements weirpb.JobManagerServer: one task manager's session.
func (s *Server) Connect(st grpc.BidiStreamingServer[weirpb.TaskManagerMessage, weirpb.JobManagerMessage]) error {
	first, err := st.Recv()
	if err != nil {
		return err
	}
	reg := first.GetRegister()
	if reg == nil || reg.TaskManagerId == "" || reg.Slots < 1 {
		return fmt.Errorf("a session must start with a Register naming the task manager and at least one slot, got %v", first)
	}
	ctx, cancel := context.WithCancelCause(st.Context())
	defer cancel(nil)
	var sendMu sync.Mutex
	token := s.leaderToken()
	send := func(m *weirpb.JobManagerMessage) error {
		m.LeaderToken = token
		if err := rpc.CheckSize(m); err != nil {
			return err
		}
		sendMu.Lock()
		defer sendMu.Unlock()
		return st.Send(m)
	}
	ss := &session{send: send, live: rpc.NewLiveness(), chunker: rpc.NewChunker(rpc.DefaultChunkSize), log: s.cfg.log,
		done: make(chan struct{}), shares: map[shareKey]*share{}}
	s.mu.Lock()
	s.sessions++
	ss.tm = TaskManager{ID: reg.TaskManagerId, Slots: int(reg.Slots), DataHost: reg.DataHost, Session: s.sessions}
	tm := ss.tm
	s.mu.Unlock()
	// Registered goes out before the session is published: from then on
	// the scheduler may deploy onto it, and a task manager takes anything
	// but Registered as its first message for a broken registration (it
	// reconnects, and a deployment sent on the abandoned session would
	// never be answered).
	if err := send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Registered{Registered: &weirpb.Registered{
		Session: tm.Session, HeartbeatIntervalMs: s.cfg.interval.Milliseconds(), HeartbeatTimeoutMs: s.cfg.timeout.Milliseconds()}}}); err != nil {
		return err
	}
	s.mu.Lock()
	old := s.tms[tm.ID]
	s.tms[tm.ID] = ss
	s.forgetLostLocked(tm.ID)
	s.notifyLocked()
	s.mu.Unlock()
	if old != nil {
		// The task manager reconnected before its old session timed out:
		// that session's tasks are gone with it.
		old.end(fmt.Errorf("%w: %s registered again", ErrTaskManagerLost, tm.ID), DetectedRegisteredAgain)
	}
	s.cfg.log.Info("task manager registered", zap.String("task_manager", tm.ID), zap.Int("slots", tm.Slots),
		zap.String("data_host", tm.DataHost), zap.Uint64("session", tm.Session))
	defer func() {
		s.mu.Lock()
		if cur, ok := s.tms[tm.ID]; ok && cur == ss {
			delete(s.tms, tm.ID)
			if !s.stopping.Load() {
				lost := ss.tm
				lost.HeartbeatAge = ss.live.Silence()
				s.forgetLostLocked(tm.ID)
				s.lost = append(s.lost, LostTaskManager{TaskManager: lost, At: time.Now(), Reason: ss.endReason()})
				if len(s.lost) > maxLost {
					s.lost = slices.Delete(s.lost, 0, len(s.lost)-maxLost)
				}
			}
			s.notifyLocked()
		}
		s.mu.Unlock()
	}()

	live := ss.live
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		cancel(rpc.Every(ctx, s.cfg.interval, func() error {
			return send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Heartbeat{Heartbeat: &weirpb.Heartbeat{SentUnixMs: time.Now().UnixMilli()}}})
		}))
	}()
	go func() {
		defer wg.Done()
		if err := live.Watch(ctx, s.cfg.timeout); errors.Is(err, rpc.ErrPeerDead) {
			cancel(fmt.Errorf("%w: %w", errSilent, err))
		}
	}()
	recvErr := make(chan error, 1)
	// Messages are handled in order on a goroutine of their own, so that
	// decoding a large snapshot never stops the session from reading
	// (heartbeats and chunks are taken in by the receiving goroutine).
	inbox := make(chan *weirpb.TaskManagerMessage, 64)
	go func() {
		for m := range inbox {
			ss.handle(m)
		}
	}()
	go func() {
		defer close(inbox)
		asm := rpc.NewAssembler(0)
		for {
			m, err := st.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			live.Seen()
			ss.receive(asm, m, inbox)
		}
	}()
	select {
	case err = <-recvErr:
		err = s.connectionEnded(err)
		cancel(err)
	case <-ctx.Done():
		if err = context.Cause(ctx); errors.Is(err, context.Canceled) {
			err = s.connectionEnded(err)
		}
	}
	wg.Wait()
	bye := ss.goodbye.Load()
	if bye != nil && !errors.Is(err, errSilent) {
		err = fmt.Errorf("%w (%s)", errStopped, *bye)
	}
	ss.end(fmt.Errorf("%w: %s: %w", ErrTaskManagerLost, tm.ID, err), detection(err))
	if bye != nil || s.stopping.Load() {
		// A clean stop on either side is no loss to warn about; its
		// tasks fail over all the same.
		s.cfg.log.Info("task manager session ended", zap.String("task_manager", tm.ID), zap.Uint64("session", tm.Session), zap.Error(err))
	} else {
		s.cfg.log.Warn("task manager lost", zap.String("task_manager", tm.ID), zap.Uint64("session", tm.Session), zap.Error(err))
	}
	if errors.Is(err, errSilent) {
		return err // returning ends the stream; the pending Recv then returns
	}
	return nil
}
