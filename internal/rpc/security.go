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

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Access to the job manager (README, "Cluster across machines"): a job
// manager bound to loopback accepts anyone on the machine; bound elsewhere
// it requires a shared token on every RPC and HTTP request (the
// "authorization: Bearer TOKEN" header), and its RPC can run over TLS.

// ErrNoToken is returned by CheckExposure for a job manager listening
// beyond loopback without a token.
var ErrNoToken = errors.New("rpc: a job manager listening beyond loopback needs --auth-token-file")

// ReadToken reads a token file: its content, trimmed, must not be empty.
func ReadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("rpc: auth token: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" || strings.ContainsAny(t, " \t\r\n") {
		return "", fmt.Errorf("rpc: auth token file %s must hold one token (no spaces)", path)
	}
	return t, nil
}

// CheckExposure refuses an address beyond loopback without a token.
func CheckExposure(addr, token string) error {
	if token != "" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("rpc: address %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%w (listening on %s)", ErrNoToken, addr)
}

// ServerTLS loads a server certificate and key (PEM) for the job manager.
func ServerTLS(certFile, keyFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("rpc: TLS certificate: %w", err)
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
		return nil, fmt.Errorf("rpc: TLS CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("rpc: TLS CA %s holds no PEM certificate", caFile)
	}
	cfg.RootCAs = pool
	return cfg, nil
}

// ServerOptions are the gRPC server options of a job manager: TLS if tlsCfg
// is set, and a token check on every call if token is not empty.
func ServerOptions(tlsCfg *tls.Config, token string) []grpc.ServerOption {
	opts := []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxMessageSize), grpc.MaxSendMsgSize(MaxMessageSize)}
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	if token != "" {
		check := func(ctx context.Context) error {
			md, _ := metadata.FromIncomingContext(ctx)
			for _, v := range md.Get("authorization") {
				if validBearer(v, token) {
					return nil
				}
			}
			return status.Error(codes.Unauthenticated, "rpc: missing or wrong auth token (--auth-token-file)")
		}
		opts = append(opts,
			grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				if err := check(ctx); err != nil {
					return nil, err
				}
				return h(ctx, req)
			}),
			grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
				if err := check(ss.Context()); err != nil {
					return err
				}
				return h(srv, ss)
			}))
	}
	return opts
}

func validBearer(header, token string) bool {
	got, ok := strings.CutPrefix(header, "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}

// RequireToken wraps an HTTP handler with the same token rule (nothing to
// check if token is empty).
func RequireToken(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !validBearer(r.Header.Get("Authorization"), token) {
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
