package jobmanager

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/jobmanager/ha"
)

// High availability (docs/internals/high-availability.md): several job
// managers of one cluster campaign in etcd; the leader keeps the jobs and
// their completed checkpoints' pointers in etcd and the checkpoints'
// metadata in the shared checkpoint storage, and runs the jobs; a standby
// serves only Leader (who leads) and refuses every other call with the
// leader's address. A leader that loses its leadership suspends its jobs at
// once and Serve returns ErrLeadershipLost.

// ErrLeadershipLost is returned by Serve when the job manager lost its
// leadership (its etcd lease could not be renewed, or another job manager
// leads): its jobs were suspended, for the new leader to resume.
var ErrLeadershipLost = errors.New("leadership lost")

// ErrStandby is wrapped by the error a standby job manager answers calls
// with: another job manager leads (or none yet).
var ErrStandby = errors.New("this job manager is a standby")

type haCfg struct {
	svc     *ha.Services
	objects storage.Storage
}

// HighAvailability makes the job manager one of several of a cluster whose
// leader is elected in etcd (svc, ha.New): jobs, the checkpoint id counter
// and completed checkpoints' pointers live in etcd, each completed
// checkpoint's metadata in objects (the checkpoint storage every job
// manager of the cluster shares). DataDir then holds no job or checkpoint.
// The caller closes svc and objects after Serve returned.
func HighAvailability(svc *ha.Services, objects storage.Storage) Opt {
	return optFunc(func(c *cfg) { c.ha = &haCfg{svc: svc, objects: objects} })
}

// Advertise sets the control-plane address a leading job manager
// announces to task managers and clients (default: its listener's
// address).
func Advertise(addr string) Opt { return optFunc(func(c *cfg) { c.advertise = addr }) }

// leadingTerm returns the leadership this job manager holds (nil: none, or
// lost).
func (s *Server) leadingTerm() *ha.Leadership {
	l := s.leadership.Load()
	if l == nil {
		return nil
	}
	select {
	case <-l.Lost():
		return nil
	default:
		return l
	}
}

// leaderToken is the fencing token control messages carry (0: standalone).
func (s *Server) leaderToken() int64 {
	if l := s.leadership.Load(); l != nil {
		return l.Token()
	}
	return 0
}

// standby returns the error calls are refused with while this job manager
// does not lead (nil when it leads, or is standalone).
func (s *Server) standby(ctx context.Context) error {
	if s.cfg.ha == nil || s.leadingTerm() != nil {
		return nil
	}
	if down := s.etcdDown.Load(); down != nil {
		return fmt.Errorf("%w; no job manager can lead while %w", ErrStandby, *down)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	addr, _, err := s.cfg.ha.svc.Leader(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("%w; the leader is unknown: %w", ErrStandby, s.cfg.ha.svc.Check(context.WithoutCancel(ctx), 2*time.Second))
	case addr == "":
		return fmt.Errorf("%w; no job manager leads yet", ErrStandby)
	}
	return fmt.Errorf("%w; the leader is at %s", ErrStandby, addr)
}

// gateOptions refuse every call but Leader on a standby, with
// codes.Unavailable naming the leader.
func (s *Server) gateOptions() []grpc.ServerOption {
	if s.cfg.ha == nil {
		return nil
	}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if info.FullMethod != weirpb.JobManager_Leader_FullMethodName {
				if err := s.standby(ctx); err != nil {
					return nil, status.Error(codes.Unavailable, err.Error())
				}
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := s.standby(ss.Context()); err != nil {
				return status.Error(codes.Unavailable, err.Error())
			}
			return h(srv, ss)
		}),
	}
}

// gateHTTP answers 503, naming the leader, on a standby (but /metrics).
func (s *Server) gateHTTP(next http.Handler) http.Handler {
	if s.cfg.ha == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			if err := s.standby(r.Context()); err != nil {
				writeJSON(w, http.StatusServiceUnavailable, flinkErrors{Errors: []string{err.Error()}})
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// readiness is the body of GET /readyz.
type readiness struct {
	Leading bool `json:"leading"`
	// Error says why a job manager that does not lead cannot (etcd is
	// unreachable); empty otherwise.
	Error string `json:"error,omitempty"`
}

// restReady answers GET /readyz without the token: 200 when this job
// manager serves the API (it leads, or is standalone), 503 on a standby. It
// tells only that, so a readiness probe (which cannot carry the token) can
// route a Service to the leader alone; who leads is Leader's, behind the
// token.
func (s *Server) restReady(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.ha != nil && s.leadingTerm() == nil {
		var r readiness
		if down := s.etcdDown.Load(); down != nil {
			r.Error = (*down).Error()
		}
		writeJSON(w, http.StatusServiceUnavailable, r)
		return
	}
	writeJSON(w, http.StatusOK, readiness{Leading: true})
}

// Leader implements weirpb.JobManagerServer.
func (s *Server) Leader(ctx context.Context, _ *weirpb.LeaderRequest) (*weirpb.LeaderInfo, error) {
	if s.cfg.ha == nil {
		return &weirpb.LeaderInfo{Leading: true}, nil
	}
	if l := s.leadingTerm(); l != nil {
		return &weirpb.LeaderInfo{Leading: true, LeaderAddress: s.advertised, Token: l.Token()}, nil
	}
	if down := s.etcdDown.Load(); down != nil {
		return nil, status.Error(codes.Unavailable, fmt.Errorf("%w; no job manager can lead while %w", ErrStandby, *down).Error())
	}
	addr, token, err := s.cfg.ha.svc.Leader(ctx)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return &weirpb.LeaderInfo{LeaderAddress: addr, Token: token}, nil
}

// lead campaigns until this job manager leads (or ctx ends, or stop
// closes), then runs the cluster's jobs until ctx ends (it resigns, after
// suspending them) or the leadership is lost (ErrLeadershipLost).
func (s *Server) lead(ctx context.Context, addr string, stop <-chan error) error {
	s.advertised = addr // read once the leadership is stored
	if host, _, err := net.SplitHostPort(addr); err == nil && (host == "" || net.ParseIP(host).IsUnspecified()) {
		s.cfg.log.Warn("the address this job manager announces when it leads is a wildcard, which other machines cannot dial; give the address to announce (--advertise-address)",
			zap.String("address", addr))
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	campaigned := make(chan struct{})
	var (
		l   *ha.Leadership
		err error
	)
	go func() {
		defer close(campaigned)
		s.cfg.log.Info("campaigning for leadership", zap.String("address", addr))
		l, err = s.cfg.ha.svc.Campaign(cctx, addr)
	}()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		s.watchEtcd(cctx, campaigned)
	}()
	defer func() { <-watched }()
	select {
	case <-campaigned:
	case serr := <-stop:
		cancel()
		<-campaigned
		if l != nil {
			s.resign(l)
		}
		return serr
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	s.jobs.store = newHAJobStore(s.cfg.ha.svc, l)
	s.jobs.cps = newHACheckpointStore(s.cfg.ha.svc, l, s.cfg.ha.objects)
	s.leadership.Store(l)
	s.cfg.log.Info("leading the cluster", zap.String("address", addr), zap.Int64("token", l.Token()))
	if err := s.resume(); err != nil {
		s.cfg.log.Error("resuming jobs", zap.Error(err))
	}
	select {
	case <-ctx.Done():
		s.stopping.Store(true)
		s.suspendAll()
		s.resign(l)
		return nil
	case err := <-stop:
		s.stopping.Store(true)
		s.suspendAll()
		s.resign(l)
		return err
	case <-l.Lost():
		s.cfg.log.Error("leadership lost: suspending every job; another job manager takes over", zap.Int64("token", l.Token()), zap.Error(l.Err()))
		s.stopping.Store(true)
		s.suspendAll()
		return fmt.Errorf("%w: %w", ErrLeadershipLost, l.Err())
	}
}

// etcdCheckEvery is how often a campaigning job manager checks that etcd
// answers, and etcdWarnEvery how often it repeats its warning while etcd
// does not.
const (
	etcdCheckEvery = 2 * time.Second
	etcdWarnEvery  = 30 * time.Second
)

// watchEtcd checks, while this job manager campaigns (until campaigned
// closes or ctx ends), that etcd answers: a campaign against an
// unreachable etcd waits silently for as long as it lasts. When etcd does
// not answer it logs a warning naming the endpoints and the error, at
// once and then every etcdWarnEvery, and the standby's refusals and
// /readyz say so (etcdDown); when it answers again it says that too.
func (s *Server) watchEtcd(ctx context.Context, campaigned <-chan struct{}) {
	defer s.etcdDown.Store(nil)
	var lastWarn time.Time
	tick := time.NewTicker(etcdCheckEvery)
	defer tick.Stop()
	for {
		err := s.cfg.ha.svc.Check(ctx, etcdCheckEvery)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			s.etcdDown.Store(&err)
			if time.Since(lastWarn) >= etcdWarnEvery {
				lastWarn = time.Now()
				s.cfg.log.Warn("etcd is unreachable: no job manager can lead until it answers",
					zap.Strings("endpoints", s.cfg.ha.svc.Endpoints()), zap.Error(err))
			}
		case !lastWarn.IsZero():
			lastWarn = time.Time{}
			s.etcdDown.Store(nil)
			s.cfg.log.Info("etcd answers again", zap.Strings("endpoints", s.cfg.ha.svc.Endpoints()))
		}
		select {
		case <-ctx.Done():
			return
		case <-campaigned:
			return
		case <-tick.C:
		}
	}
}

// resign hands the leadership over at once (the data stays).
func (s *Server) resign(l *ha.Leadership) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.Resign(ctx); err != nil {
		s.cfg.log.Warn("resigning the leadership", zap.Error(err))
	}
}

// announced is the address a leader announces for listener address lis.
func (s *Server) announced(lis string) string { return cmp.Or(s.cfg.advertise, lis) }
