// Package rpc owns the control-plane contract between the job manager, the
// task managers and streamctl: the protocol (package weirpb, generated from
// weirpb/control.proto), dialing (and finding the leader among several job
// managers: leader.go), the heartbeat rule both ends of a
// task-manager session apply to detect a dead peer, and the access rules of
// Weir's servers (docs/guide/security.md): the token, TLS and limits of the
// gRPC server (security.go), the HTTP servers' timeouts and browser guard
// (http.go), and the warnings about risky settings (warnings.go).
//
// It is the only package jobmanager and taskmanager share. It must not
// import runtime, jobmanager, taskmanager, sources or sinks: it carries ids
// and bytes, never operators.
package rpc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Defaults of a task-manager session: a heartbeat every 500ms each way, and
// a peer silent for 3s is dead (a killed process is noticed within a few
// seconds even when its connection does not close).
const (
	DefaultHeartbeatInterval = 500 * time.Millisecond
	DefaultHeartbeatTimeout  = 3 * time.Second
)

// ErrPeerDead is returned by Liveness.Watch when the peer sent nothing for
// the heartbeat timeout.
var ErrPeerDead = errors.New("peer sent no heartbeat in time")

// ErrUnreachable wraps a failure to reach the job manager.
var ErrUnreachable = errors.New("job manager unreachable")

// DialOpt configures Dial.
type DialOpt interface{ apply(*dialCfg) }

type dialCfg struct {
	tls   *tls.Config
	token string
}

type dialOpt func(*dialCfg)

func (o dialOpt) apply(c *dialCfg) { o(c) }

// WithTLS dials over TLS with cfg (see ClientTLS); default: plaintext.
func WithTLS(cfg *tls.Config) DialOpt { return dialOpt(func(c *dialCfg) { c.tls = cfg }) }

// WithToken sends token with every call (the job manager's
// --auth-token-file); "" sends none.
func WithToken(token string) DialOpt { return dialOpt(func(c *dialCfg) { c.token = token }) }

// Dial returns a client connection to addr, plaintext unless WithTLS. grpc
// connects lazily: the first call fails with ErrUnreachable when nobody
// listens at addr.
func Dial(addr string, opts ...DialOpt) (*grpc.ClientConn, error) {
	if addr == "" {
		return nil, fmt.Errorf("%w: no address", ErrUnreachable)
	}
	var c dialCfg
	for _, o := range opts {
		o.apply(&c)
	}
	creds := insecure.NewCredentials()
	if c.tls != nil {
		creds = credentials.NewTLS(c.tls)
	}
	gopts := []grpc.DialOption{grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageSize), grpc.MaxCallSendMsgSize(MaxMessageSize))}
	if c.token != "" {
		gopts = append(gopts, grpc.WithPerRPCCredentials(tokenCreds{token: c.token}))
	}
	cc, err := grpc.NewClient(addr, gopts...)
	if err != nil {
		return nil, fmt.Errorf("%w at %s: %w", ErrUnreachable, addr, err)
	}
	return cc, nil
}

// Liveness records when a peer was last heard from. Seen is called for
// every message received; Watch fails once the peer has been silent for
// longer than the timeout. Safe for concurrent use.
type Liveness struct {
	last atomic.Int64 // unix nanos
	now  func() time.Time
}

// NewLiveness returns a Liveness that has just heard from its peer.
func NewLiveness() *Liveness {
	l := &Liveness{now: time.Now}
	l.Seen()
	return l
}

// Seen records that the peer was heard from now.
func (l *Liveness) Seen() { l.last.Store(l.now().UnixNano()) }

// Silence is how long the peer has been silent.
func (l *Liveness) Silence() time.Duration {
	return l.now().Sub(time.Unix(0, l.last.Load()))
}

// Watch blocks until ctx is done (ctx's error) or the peer has been silent
// for longer than timeout (an error wrapping ErrPeerDead). It wakes when
// the silence would pass the timeout if nothing came meanwhile, so a
// silent peer is declared dead as soon as its silence passes the timeout
// (checking four times per timeout declared it up to a quarter timeout
// late: 750 ms of a 3 s timeout, added to every recovery from a paused
// task manager).
func (l *Liveness) Watch(ctx context.Context, timeout time.Duration) error {
	if timeout <= 0 {
		return fmt.Errorf("heartbeat timeout %v must be positive", timeout)
	}
	t := time.NewTimer(timeout + time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			s := l.Silence()
			if s > timeout {
				return fmt.Errorf("%w: silent for %v (timeout %v)", ErrPeerDead, s.Round(time.Millisecond), timeout)
			}
			t.Reset(timeout - s + time.Millisecond)
		}
	}
}

// Every calls send every interval until ctx is done or send fails; it
// returns send's error, or ctx's.
func Every(ctx context.Context, interval time.Duration, send func() error) error {
	if interval <= 0 {
		return fmt.Errorf("heartbeat interval %v must be positive", interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if err := send(); err != nil {
				return err
			}
		}
	}
}
