// Package s3server owns the embedded S3-compatible server (gofakes3, in
// memory) that tests and single-machine clusters use as checkpoint storage,
// as internal/broker is the embedded Kafka. It serves plain HTTP on
// loopback, accepts any credentials, and keeps objects only as long as the
// process lives: it is for tests and trials, never a store to keep state in.
// It must not be used by production code paths other than `local`-style
// conveniences that say so.
package s3server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/weirstream/weir/internal/rpc"
)

// Server is a running embedded S3 server.
type Server struct {
	srv      *http.Server
	addr     string
	backend  *s3mem.Backend
	done     chan struct{}
	closeErr error
	once     sync.Once
}

// Opt configures Start.
type Opt interface{ apply(*cfg) }

type cfg struct {
	listen  string
	buckets []string
}

type opt func(*cfg)

func (o opt) apply(c *cfg) { o(c) }

// Listen sets the address to listen on, by default 127.0.0.1:0 (a free
// port on loopback).
func Listen(addr string) Opt { return opt(func(c *cfg) { c.listen = addr }) }

// Buckets creates these buckets at start.
func Buckets(names ...string) Opt {
	return opt(func(c *cfg) { c.buckets = append(c.buckets, names...) })
}

// Start starts a server; Close stops it.
func Start(ctx context.Context, opts ...Opt) (*Server, error) {
	c := cfg{listen: "127.0.0.1:0"}
	for _, o := range opts {
		o.apply(&c)
	}
	backend := s3mem.New()
	for _, b := range c.buckets {
		if err := backend.CreateBucket(b); err != nil {
			return nil, fmt.Errorf("embedded S3: bucket %q: %w", b, err)
		}
	}
	faker := gofakes3.New(backend, gofakes3.WithLogger(quiet{}), gofakes3.WithoutVersioning())
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", c.listen)
	if err != nil {
		return nil, fmt.Errorf("embedded S3: %w", err)
	}
	s := &Server{srv: rpc.NewHTTPServer(faker.Server()), addr: ln.Addr().String(), backend: backend, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.closeErr = err
		}
	}()
	return s, nil
}

// Addr is the host:port the server listens on.
func (s *Server) Addr() string { return s.addr }

// Endpoint is the server's URL, for an s3:// storage URL's endpoint
// parameter.
func (s *Server) Endpoint() string { return "http://" + s.addr }

// URL is the checkpoint storage URL of bucket/prefix on this server.
func (s *Server) URL(bucket, prefix string) string {
	return fmt.Sprintf("s3://%s/%s?endpoint=%s", bucket, prefix, s.Endpoint())
}

// CreateBucket creates a bucket.
func (s *Server) CreateBucket(name string) error { return s.backend.CreateBucket(name) }

// Close stops the server and waits for it; it may be called more than once.
func (s *Server) Close() error {
	s.once.Do(func() {
		err := s.srv.Close()
		<-s.done
		if s.closeErr == nil {
			s.closeErr = err
		}
	})
	return s.closeErr
}

// quiet drops gofakes3's request logs.
type quiet struct{}

func (quiet) Print(gofakes3.LogLevel, ...any) {}
