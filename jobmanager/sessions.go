package jobmanager

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/internal/rpc/weirpb"
)

// TaskManager is a registered task manager as the job manager sees it.
type TaskManager struct {
	ID          string
	Slots       int
	DataAddress string
	// Session increases with each registration of the same id.
	Session uint64
}

// Opt configures a Server.
type Opt interface{ apply(*cfg) }

type optFunc func(*cfg)

func (f optFunc) apply(c *cfg) { f(c) }

type cfg struct {
	interval time.Duration
	timeout  time.Duration
	log      *zap.Logger
}

// HeartbeatInterval sets how often the job manager heartbeats each task
// manager, and asks them to heartbeat it (default rpc.DefaultHeartbeatInterval).
func HeartbeatInterval(d time.Duration) Opt { return optFunc(func(c *cfg) { c.interval = d }) }

// HeartbeatTimeout sets after how long a silent task manager is dead
// (default rpc.DefaultHeartbeatTimeout).
func HeartbeatTimeout(d time.Duration) Opt { return optFunc(func(c *cfg) { c.timeout = d }) }

// Logger sets the logger (default: none).
func Logger(l *zap.Logger) Opt { return optFunc(func(c *cfg) { c.log = l }) }

// Server is the job manager's gRPC service. Today it runs task-manager
// sessions (registration, heartbeats both ways, death detection); the
// client API answers Unimplemented.
type Server struct {
	weirpb.UnimplementedJobManagerServer
	cfg cfg

	mu       sync.Mutex
	tms      map[string]TaskManager
	sessions uint64
	changed  chan struct{} // closed and replaced on every change
}

// New returns a job manager server.
func New(opts ...Opt) *Server {
	c := cfg{interval: rpc.DefaultHeartbeatInterval, timeout: rpc.DefaultHeartbeatTimeout, log: zap.NewNop()}
	for _, o := range opts {
		o.apply(&c)
	}
	return &Server{cfg: c, tms: map[string]TaskManager{}, changed: make(chan struct{})}
}

// Serve serves the job manager's gRPC service on lis until ctx is done.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	gs := grpc.NewServer()
	weirpb.RegisterJobManagerServer(gs, s)
	stop := context.AfterFunc(ctx, gs.Stop)
	defer stop()
	if err := gs.Serve(lis); err != nil && ctx.Err() == nil {
		return fmt.Errorf("jobmanager: serve: %w", err)
	}
	return nil
}

// TaskManagers lists the live task managers by id.
func (s *Server) TaskManagers() []TaskManager {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]TaskManager, 0, len(s.tms))
	for _, tm := range s.tms {
		out = append(out, tm)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
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

// errSilent ends a session whose task manager stopped heartbeating.
var errSilent = errors.New("jobmanager: task manager silent")

// Connect implements weirpb.JobManagerServer: one task manager's session.
func (s *Server) Connect(st grpc.BidiStreamingServer[weirpb.TaskManagerMessage, weirpb.JobManagerMessage]) error {
	first, err := st.Recv()
	if err != nil {
		return err
	}
	reg := first.GetRegister()
	if reg == nil || reg.TaskManagerId == "" || reg.Slots < 1 {
		return fmt.Errorf("jobmanager: a session must start with a Register naming the task manager and at least one slot, got %v", first)
	}
	s.mu.Lock()
	s.sessions++
	tm := TaskManager{ID: reg.TaskManagerId, Slots: int(reg.Slots), DataAddress: reg.DataAddress, Session: s.sessions}
	s.tms[tm.ID] = tm
	s.notifyLocked()
	s.mu.Unlock()
	s.cfg.log.Info("task manager registered", zap.String("task_manager", tm.ID), zap.Int("slots", tm.Slots),
		zap.String("data_address", tm.DataAddress), zap.Uint64("session", tm.Session))
	defer func() {
		s.mu.Lock()
		if cur, ok := s.tms[tm.ID]; ok && cur.Session == tm.Session {
			delete(s.tms, tm.ID)
			s.notifyLocked()
		}
		s.mu.Unlock()
	}()

	ctx, cancel := context.WithCancelCause(st.Context())
	defer cancel(nil)
	var sendMu sync.Mutex
	send := func(m *weirpb.JobManagerMessage) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return st.Send(m)
	}
	if err := send(&weirpb.JobManagerMessage{Msg: &weirpb.JobManagerMessage_Registered{Registered: &weirpb.Registered{
		Session: tm.Session, HeartbeatIntervalMs: s.cfg.interval.Milliseconds(), HeartbeatTimeoutMs: s.cfg.timeout.Milliseconds()}}}); err != nil {
		return err
	}
	live := rpc.NewLiveness()
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
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				recvErr <- err
				return
			}
			live.Seen()
		}
	}()
	select {
	case err = <-recvErr:
		cancel(err)
	case <-ctx.Done():
		err = context.Cause(ctx)
	}
	wg.Wait()
	s.cfg.log.Warn("task manager lost", zap.String("task_manager", tm.ID), zap.Uint64("session", tm.Session), zap.Error(err))
	if errors.Is(err, errSilent) {
		return err // returning ends the stream; the pending Recv then returns
	}
	return nil
}
