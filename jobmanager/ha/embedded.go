package ha

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Embedded is an etcd server run inside this process: the default for
// development and tests, as the embedded broker is for Kafka. One member,
// on loopback ports it picks.
type Embedded struct {
	etcd     *embed.Etcd
	endpoint string
	once     sync.Once
}

// EmbeddedOpt configures StartEmbedded.
type EmbeddedOpt interface{ applyEmbedded(*embeddedCfg) }

type embeddedCfg struct{ fast bool }

type embeddedOpt func(*embeddedCfg)

func (o embeddedOpt) applyEmbedded(c *embeddedCfg) { o(c) }

// FastForTests makes the embedded etcd elect itself in about 100 ms and
// skip fsync: for tests only (a crash loses its recent writes).
func FastForTests() EmbeddedOpt { return embeddedOpt(func(c *embeddedCfg) { c.fast = true }) }

// StartEmbedded starts an etcd member keeping its data in dir and waits
// until it serves clients.
func StartEmbedded(ctx context.Context, dir string, opts ...EmbeddedOpt) (*Embedded, error) {
	var c embeddedCfg
	for _, o := range opts {
		o.applyEmbedded(&c)
	}
	client, peer, err := freeLoopbackURLs(ctx)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: %w", err)
	}
	cfg := embed.NewConfig()
	cfg.Name = "weir"
	cfg.Dir = dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.Metrics = "basic"
	if c.fast {
		cfg.TickMs, cfg.ElectionMs, cfg.UnsafeNoFsync = 10, 100, true
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd: %w", err)
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("embedded etcd: %w", ctx.Err())
	case <-time.After(time.Minute):
		e.Close()
		return nil, fmt.Errorf("embedded etcd: not ready after a minute")
	}
	return &Embedded{etcd: e, endpoint: client.String()}, nil
}

// Endpoints are the client URLs of the embedded etcd.
func (e *Embedded) Endpoints() []string { return []string{e.endpoint} }

// Close stops the embedded etcd; it may be called more than once.
func (e *Embedded) Close() { e.once.Do(e.etcd.Close) }

// freeLoopbackURLs picks two free loopback ports.
func freeLoopbackURLs(ctx context.Context) (client, peer url.URL, err error) {
	var ports [2]string
	for i := range ports {
		ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
		if err != nil {
			return url.URL{}, url.URL{}, err
		}
		ports[i] = ln.Addr().String()
		ln.Close()
	}
	return url.URL{Scheme: "http", Host: ports[0]}, url.URL{Scheme: "http", Host: ports[1]}, nil
}
