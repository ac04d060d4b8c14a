package rpc

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// Access to the job manager (README, "Cluster across machines"): a job
// manager bound to loopback accepts anyone on the machine; bound elsewhere
// it requires a shared token on every RPC and HTTP request (the
// "authorization: Bearer TOKEN" header), and its RPC can run over TLS.

// ErrNoToken is returned by CheckExposure for a job manager listening
// beyond loopback without a token.
var ErrNoToken = errors.New("a job manager listening beyond loopback needs --auth-token-file")

// ReadToken reads a token file: its content, trimmed, must not be empty.
func ReadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("auth token: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" || strings.ContainsAny(t, " \t\r\n") {
		return "", fmt.Errorf("auth token file %s must hold one token (no spaces)", path)
	}
	return t, nil
}

// CheckExposure refuses an address beyond loopback without a token.
func CheckExposure(addr, token string) error {
	if token != "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("address %q: %w", addr, err)
	}
	if !BeyondLoopback(addr) {
		return nil
	}
	return fmt.Errorf("%w (listening on %s)", ErrNoToken, addr)
}

// BeyondLoopback reports whether a server bound to addr (HOST:PORT, or a
// host alone) is reachable from other machines: its host is not
// "localhost" or a loopback address (an empty host binds every
// interface).
func BeyondLoopback(addr string) bool { return !isLoopbackHost(hostName(addr)) }

// ServerTLS loads a server certificate and key (PEM) for the job manager.
func ServerTLS(certFile, keyFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// ClientTLS trusts the CA certificates in caFile (PEM; "" trusts the
// system's roots).
func ClientTLS(caFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile == "" {
		return cfg, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("TLS CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("TLS CA %s holds no PEM certificate", caFile)
	}
	cfg.RootCAs = pool
	return cfg, nil
}

// AuthOpt configures ServerOptions, RequireToken and BrowserGuard.
type AuthOpt interface{ apply(*authCfg) }

type authCfg struct{ rejects *RejectLog }

type authOpt func(*authCfg)

func (o authOpt) apply(c *authCfg) { o(c) }

// LogRejections logs every refused request to l (default: none).
func LogRejections(l *RejectLog) AuthOpt { return authOpt(func(c *authCfg) { c.rejects = l }) }

// RejectLog logs refused requests (a missing or wrong token, a foreign
// Host, a simple cross-site request) at warn, with the reason, at most once
// per peer host per interval: a client retrying with a bad token does not
// flood the log, and each entry counts the refusals it stands for. It
// never logs a token. One RejectLog may serve several listeners (RPC and
// HTTP).
type RejectLog struct {
	log   *zap.Logger
	every time.Duration
	now   func() time.Time

	mu    sync.Mutex
	peers map[string]*rejected
}

type rejected struct {
	logged     time.Time
	suppressed int
}

// NewRejectLog logs refused requests to log, at most once per peer
// host per every.
func NewRejectLog(log *zap.Logger, every time.Duration) *RejectLog {
	return &RejectLog{log: log, every: every, now: time.Now, peers: map[string]*rejected{}}
}

// Rejected records a refused request from addr (host:port) for what (an
// RPC method or an HTTP path), refused because of reason.
func (l *RejectLog) Rejected(addr, what, reason string) {
	if l == nil {
		return
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	now := l.now()
	l.mu.Lock()
	r := l.peers[host]
	if r != nil && now.Sub(r.logged) < l.every {
		r.suppressed++
		l.mu.Unlock()
		return
	}
	for h, old := range l.peers { // forget peers quiet for an interval
		if now.Sub(old.logged) >= l.every {
			delete(l.peers, h)
		}
	}
	suppressed := 0
	if r != nil {
		suppressed = r.suppressed
	}
	l.peers[host] = &rejected{logged: now}
	l.mu.Unlock()
	l.log.Warn("request refused", zap.String("peer", addr), zap.String("request", what),
		zap.String("reason", reason), zap.Int("refused_since_last_logged", suppressed),
		zap.Duration("logged_at_most_every", l.every))
}

// Limits of the job manager's gRPC server (docs/guide/security.md). A
// connection holds at most MaxStreamsPerConnection calls at once, so an
// authenticated peer buffers at most that many messages of MaxMessageSize;
// a stream's token is checked when its headers arrive, so an
// unauthenticated one buffers nothing.
const (
	// MaxStreamsPerConnection bounds the concurrent calls of one
	// connection: a task manager's session is one, a streamctl command one.
	MaxStreamsPerConnection = 32
	// maxHeaderListSize bounds a call's headers (read before any check).
	maxHeaderListSize = 64 << 10
	// connectionTimeout bounds a new connection's TLS and HTTP/2
	// handshakes.
	connectionTimeout = 10 * time.Second
	// maxConnectionIdle closes a connection without a call for that long.
	maxConnectionIdle = 5 * time.Minute
	// keepaliveTime and keepaliveTimeout: the server pings a connection
	// silent for keepaliveTime and closes it if the ping is not answered
	// within keepaliveTimeout.
	keepaliveTime    = time.Minute
	keepaliveTimeout = 20 * time.Second
	// minClientPingInterval: a client pinging more often is disconnected
	// (GOAWAY "too_many_pings"); Weir's clients never ping.
	minClientPingInterval = time.Minute
)

// errUnauthenticated is what a refused call is answered.
var errUnauthenticated = status.Error(codes.Unauthenticated, "missing or wrong auth token (--auth-token-file)")

// ServerOptions are the gRPC server options of a job manager: TLS if tlsCfg
// is set, a token check on every call if token is not empty, and the
// limits above. The token is checked when a call's headers arrive (a tap
// handle), before its first message is read: a refused call is answered
// Unauthenticated at once and its body discarded unread.
func ServerOptions(tlsCfg *tls.Config, token string, opts ...AuthOpt) []grpc.ServerOption {
	var ac authCfg
	for _, o := range opts {
		o.apply(&ac)
	}
	sopts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxMessageSize), grpc.MaxSendMsgSize(MaxMessageSize),
		grpc.MaxConcurrentStreams(MaxStreamsPerConnection),
		grpc.MaxHeaderListSize(maxHeaderListSize),
		grpc.ConnectionTimeout(connectionTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: maxConnectionIdle, Time: keepaliveTime, Timeout: keepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: minClientPingInterval}),
	}
	if tlsCfg != nil {
		sopts = append(sopts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	if token != "" {
		sopts = append(sopts, grpc.InTapHandle(func(ctx context.Context, info *tap.Info) (context.Context, error) {
			reason := "no authorization header"
			for _, v := range info.Header.Get("authorization") {
				if reason = checkBearer(v, token); reason == "" {
					return ctx, nil
				}
			}
			addr := "unknown"
			if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
				addr = p.Addr.String()
			}
			ac.rejects.Rejected(addr, info.FullMethodName, reason)
			return ctx, errUnauthenticated
		}))
	}
	return sopts
}

// checkBearer says why header does not carry token with the Bearer scheme
// ("" when it does). The scheme is case-insensitive (RFC 7235, 2.1).
func checkBearer(header, token string) string {
	scheme, got, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "not a Bearer authorization"
	}
	if subtle.ConstantTimeCompare([]byte(strings.TrimLeft(got, " ")), []byte(token)) != 1 {
		return "wrong token"
	}
	return ""
}

// RequireToken wraps an HTTP handler with the same token rule (nothing to
// check if token is empty).
func RequireToken(token string, h http.Handler, opts ...AuthOpt) http.Handler {
	if token == "" {
		return h
	}
	var ac authCfg
	for _, o := range opts {
		o.apply(&ac)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reason := "no authorization header"
		if v := r.Header.Get("Authorization"); v != "" {
			reason = checkBearer(v, token)
		}
		if reason != "" {
			ac.rejects.Rejected(r.RemoteAddr, r.Method+" "+r.URL.Path, reason)
			w.Header().Set("WWW-Authenticate", `Bearer realm="weir"`)
			http.Error(w, "missing or wrong auth token", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// tokenCreds sends the token with every call.
type tokenCreds struct{ token string }

func (c tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + c.token}, nil
}

// RequireTransportSecurity is false: on a trusted network the token may
// travel in plaintext (use TLS beyond it).
func (c tokenCreds) RequireTransportSecurity() bool { return false }
