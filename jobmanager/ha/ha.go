// Package ha owns the job manager's high-availability services on etcd:
// leader election among job managers, the fencing token of a leadership,
// fenced writes (every write is an etcd transaction that succeeds only while
// the writer still holds the leadership), reads for everyone, leader
// discovery, and an embedded etcd for development and tests. All keys live
// under one cluster's namespace, so two clusters on one etcd never see each
// other's data.
//
// It stores bytes by key and knows nothing of jobs, checkpoints or their
// encoding, and it never deletes data on its own: what a leader writes stays
// until a leader deletes it. It must not import taskmanager or jobmanager
// (the job manager's stores on it are in jobmanager):
// docs/internals/high-availability.md.
package ha

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

var (
	// ErrNotLeader is returned by a write of a leadership that is lost:
	// another job manager leads, or this one's lease expired or was about to.
	ErrNotLeader = errors.New("not the leader")
	// ErrExists is returned by Create when the key exists.
	ErrExists = errors.New("key exists")
	// ErrBadCluster is returned for a cluster id that cannot name a namespace.
	ErrBadCluster = errors.New("bad cluster id")
	// ErrUnreachable is wrapped by Check's error when etcd does not answer.
	ErrUnreachable = errors.New("etcd unreachable")
)

// Opt configures New.
type Opt interface{ apply(*cfg) }

type cfg struct {
	ttl                time.Duration
	dialTimeout        time.Duration
	logger             *zap.Logger
	tls                *tls.Config
	username, password string
}

type opt func(*cfg)

func (o opt) apply(c *cfg) { o(c) }

// LeaseTTL sets the time-to-live of a leader's etcd lease, by default 15 s
// (whole seconds, at least 2). A leader that cannot renew its lease steps
// down after half of it, so a brief disconnect keeps the leadership and a
// lasting one ends it before etcd lets another job manager take over.
func LeaseTTL(d time.Duration) Opt {
	return opt(func(c *cfg) { c.ttl = max(d.Truncate(time.Second), 2*time.Second) })
}

// DialTimeout bounds connecting to etcd, by default 5 s.
func DialTimeout(d time.Duration) Opt { return opt(func(c *cfg) { c.dialTimeout = d }) }

// TLS connects to etcd over TLS with t (its client certificate, if any,
// authenticates this job manager), by default plaintext.
func TLS(t *tls.Config) Opt { return opt(func(c *cfg) { c.tls = t }) }

// Auth authenticates to etcd as username with password (etcd's role-based
// access control), by default not at all.
func Auth(username, password string) Opt {
	return opt(func(c *cfg) { c.username, c.password = username, password })
}

// Logger sets the logger of the etcd client, by default none.
func Logger(l *zap.Logger) Opt { return opt(func(c *cfg) { c.logger = l }) }

// Services are one job manager's connection to the HA services of a cluster.
type Services struct {
	client    *clientv3.Client
	ns        string // "/weir/<cluster>/"
	cfg       cfg
	endpoints []string
}

// Endpoints are the etcd client URLs the Services were given.
func (s *Services) Endpoints() []string { return slices.Clone(s.endpoints) }

// Check reads one key within timeout and returns an error wrapping
// ErrUnreachable, naming the endpoints, when etcd does not answer.
func (s *Services) Check(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := s.client.Get(ctx, s.electionPrefix(), clientv3.WithCountOnly()); err != nil {
		if ctx.Err() != nil && !errors.Is(err, context.Canceled) {
			err = fmt.Errorf("no answer within %v (%w)", timeout, err)
		}
		return fmt.Errorf("%w at %s: %w", ErrUnreachable, strings.Join(s.endpoints, ","), err)
	}
	return nil
}

// New connects to etcd at endpoints for the cluster named cluster. Close
// releases it.
func New(ctx context.Context, endpoints []string, cluster string, opts ...Opt) (*Services, error) {
	c := cfg{ttl: 15 * time.Second, dialTimeout: 5 * time.Second, logger: zap.NewNop()}
	for _, o := range opts {
		o.apply(&c)
	}
	if cluster == "" || strings.ContainsAny(cluster, "/ \t\n") {
		return nil, fmt.Errorf("%w %q: a non-empty name without slashes or spaces", ErrBadCluster, cluster)
	}
	client, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: c.dialTimeout, Logger: c.logger, Context: ctx,
		TLS: c.tls, Username: c.username, Password: c.password})
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", strings.Join(endpoints, ","), err)
	}
	return &Services{client: client, ns: "/weir/" + cluster + "/", cfg: c, endpoints: slices.Clone(endpoints)}, nil
}

// Close closes the connection to etcd.
func (s *Services) Close() error { return s.client.Close() }

func (s *Services) electionPrefix() string { return s.ns + "leader" }

// Campaign blocks until this job manager leads the cluster, announcing addr
// (where task managers and clients reach it), or ctx ends.
func (s *Services) Campaign(ctx context.Context, addr string) (*Leadership, error) {
	granted := time.Now() // the lease runs from no earlier than this
	lease, err := s.client.Grant(ctx, int64(s.cfg.ttl/time.Second))
	if err != nil {
		return nil, fmt.Errorf("etcd lease: %w", err)
	}
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l := &Leadership{s: s, lease: lease.ID, cancel: cancel, lost: make(chan struct{}), lastRenew: granted, done: make(chan struct{})}
	l.ctx, l.endCtx = context.WithCancelCause(context.Background())
	go l.watch(lctx)
	session, err := concurrency.NewSession(s.client, concurrency.WithLease(lease.ID), concurrency.WithContext(lctx))
	if err != nil {
		l.abandon()
		return nil, fmt.Errorf("etcd session: %w", err)
	}
	l.election = concurrency.NewElection(session, s.electionPrefix())
	if err := l.election.Campaign(ctx, addr); err != nil {
		l.abandon()
		return nil, fmt.Errorf("campaign: %w", err)
	}
	l.key, l.token = l.election.Key(), l.election.Rev()
	return l, nil
}

// Leader returns the address the current leader announced and its fencing
// token, or empty and 0 when no job manager leads.
func (s *Services) Leader(ctx context.Context) (addr string, token int64, err error) {
	resp, err := s.client.Get(ctx, s.electionPrefix()+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return "", 0, fmt.Errorf("etcd: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return "", 0, nil
	}
	return string(resp.Kvs[0].Value), resp.Kvs[0].CreateRevision, nil
}

// Get returns the value of key, and whether it exists.
func (s *Services) Get(ctx context.Context, key string) ([]byte, bool, error) {
	resp, err := s.client.Get(ctx, s.ns+"data/"+key)
	if err != nil {
		return nil, false, fmt.Errorf("etcd get %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, false, nil
	}
	return resp.Kvs[0].Value, true, nil
}

// List calls fn for every key under prefix with its value, in key order.
func (s *Services) List(ctx context.Context, prefix string, fn func(key string, value []byte) error) error {
	base := s.ns + "data/"
	resp, err := s.client.Get(ctx, base+prefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return fmt.Errorf("etcd list %s: %w", prefix, err)
	}
	for _, kv := range resp.Kvs {
		if err := fn(strings.TrimPrefix(string(kv.Key), base), kv.Value); err != nil {
			return err
		}
	}
	return nil
}

// Leadership is one job manager's term as leader. Its writes succeed only
// while it lasts; Lost is closed when it ends.
type Leadership struct {
	s        *Services
	lease    clientv3.LeaseID
	election *concurrency.Election
	key      string
	token    int64
	cancel   context.CancelFunc

	mu        sync.Mutex
	lastRenew time.Time
	lostOnce  sync.Once
	lost      chan struct{}
	why       error           // why the leadership ended, once lost is closed
	ctx       context.Context // canceled (cause: ErrNotLeader) when lost is closed
	endCtx    context.CancelCauseFunc
	done      chan struct{} // closed when watch returns
}

// Token is the leadership's fencing token: the revision at which it began,
// larger for every later leadership of the cluster. Control messages carry
// it so task managers refuse a deposed leader's.
func (l *Leadership) Token() int64 { return l.token }

// Lost is closed when the leadership ends: resigned, or the lease could not
// be renewed for half its time-to-live (before etcd lets it expire), or
// etcd revoked it.
func (l *Leadership) Lost() <-chan struct{} { return l.lost }

func (l *Leadership) markLost(why error) {
	l.lostOnce.Do(func() {
		l.mu.Lock()
		l.why = why
		l.mu.Unlock()
		close(l.lost)
		l.endCtx(fmt.Errorf("%w: %w", ErrNotLeader, why))
	})
}

// Context is canceled when the leadership ends, with a cause wrapping
// ErrNotLeader: calls made on behalf of the leadership end with it instead
// of waiting out an unreachable etcd.
func (l *Leadership) Context() context.Context { return l.ctx }

// Err says why the leadership ended (nil while it lasts).
func (l *Leadership) Err() error {
	select {
	case <-l.lost:
	default:
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.why
}

// watch renews the lease every sixth of its time-to-live (each renewal
// bounded by that time) and declares the leadership lost when no renewal
// succeeded for half the time-to-live, counted from when the last
// successful one was sent, or when the lease is gone. It does not rely on
// the client's KeepAlive, which renews only every third of the
// time-to-live plus up to half a second and so can leave a gap above half
// a short time-to-live on a healthy connection.
func (l *Leadership) watch(ctx context.Context) {
	defer close(l.done)
	half, every := l.s.cfg.ttl/2, l.s.cfg.ttl/6
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-l.lost:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, every)
		resp, err := l.s.client.KeepAliveOnce(rctx, l.lease)
		cancel()
		switch {
		case err == nil && resp.TTL > 0:
			l.mu.Lock()
			l.lastRenew = sent
			l.mu.Unlock()
		case errors.Is(err, rpctypes.ErrLeaseNotFound), err == nil:
			l.markLost(errors.New("the lease is gone (expired or revoked)"))
			return
		}
		l.mu.Lock()
		since := time.Since(l.lastRenew)
		l.mu.Unlock()
		if since >= half {
			l.markLost(fmt.Errorf("the lease was not renewed for %v, half its time-to-live", since.Round(time.Millisecond)))
			return
		}
	}
}

// valid reports whether the leadership may still write: not lost and
// renewed within half the lease's time-to-live.
func (l *Leadership) valid() bool {
	select {
	case <-l.lost:
		return false
	default:
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Since(l.lastRenew) < l.s.cfg.ttl/2
}

// txn runs ops if this leadership's key still exists with its creation
// revision, and cond holds.
func (l *Leadership) txn(ctx context.Context, what string, cond []clientv3.Cmp, ops ...clientv3.Op) error {
	if !l.valid() {
		l.markLost(fmt.Errorf("the lease was not renewed for %v, half its time-to-live", l.s.cfg.ttl/2))
		return fmt.Errorf("%s: %w", what, ErrNotLeader)
	}
	cmps := append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.token)}, cond...)
	resp, err := l.s.client.Txn(ctx).If(cmps...).Then(ops...).Else(clientv3.OpGet(l.key)).Commit()
	if err != nil {
		return fmt.Errorf("%s: etcd: %w", what, err)
	}
	if resp.Succeeded {
		return nil
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 0 || kvs[0].CreateRevision != l.token {
		l.markLost(errors.New("the leader key is gone or another job manager's"))
		return fmt.Errorf("%s: %w", what, ErrNotLeader)
	}
	return fmt.Errorf("%s: %w", what, ErrExists)
}

// List calls fn for every key under prefix with its value, in key order,
// read in one etcd transaction with the check that this job manager still
// leads (ErrNotLeader otherwise): a fenced read. What it returns was the
// data while this leadership lasted, so a decision taken on it (which
// objects no checkpoint references any more) is the leader's, never a
// deposed one's.
func (l *Leadership) List(ctx context.Context, prefix string, fn func(key string, value []byte) error) error {
	if !l.valid() {
		l.markLost(fmt.Errorf("the lease was not renewed for %v, half its time-to-live", l.s.cfg.ttl/2))
		return fmt.Errorf("fenced list %s: %w", prefix, ErrNotLeader)
	}
	base := l.s.ns + "data/"
	resp, err := l.s.client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.token)).
		Then(clientv3.OpGet(base+prefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))).
		Commit()
	if err != nil {
		return fmt.Errorf("fenced list %s: etcd: %w", prefix, err)
	}
	if !resp.Succeeded {
		l.markLost(errors.New("the leader key is gone or another job manager's"))
		return fmt.Errorf("fenced list %s: %w", prefix, ErrNotLeader)
	}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		if err := fn(strings.TrimPrefix(string(kv.Key), base), kv.Value); err != nil {
			return err
		}
	}
	return nil
}

// DeletePrefix removes every key under prefix if this job manager still
// leads, in one transaction.
func (l *Leadership) DeletePrefix(ctx context.Context, prefix string) error {
	return l.txn(ctx, "delete "+prefix+"*", nil, clientv3.OpDelete(l.s.ns+"data/"+prefix, clientv3.WithPrefix()))
}

// Put writes key if this job manager still leads.
func (l *Leadership) Put(ctx context.Context, key string, value []byte) error {
	return l.txn(ctx, "put "+key, nil, clientv3.OpPut(l.s.ns+"data/"+key, string(value)))
}

// Create writes key if this job manager still leads and key does not
// exist (ErrExists otherwise): the commit point of a checkpoint's pointer.
func (l *Leadership) Create(ctx context.Context, key string, value []byte) error {
	full := l.s.ns + "data/" + key
	return l.txn(ctx, "create "+key, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(full), "=", 0)}, clientv3.OpPut(full, string(value)))
}

// Delete removes key if this job manager still leads.
func (l *Leadership) Delete(ctx context.Context, key string) error {
	return l.txn(ctx, "delete "+key, nil, clientv3.OpDelete(l.s.ns+"data/"+key))
}

// Resign ends the leadership at once, so a standby takes over without
// waiting for the lease to expire. Data stays.
func (l *Leadership) Resign(ctx context.Context) error {
	l.markLost(errors.New("resigned"))
	err := l.election.Resign(ctx)
	if _, rerr := l.s.client.Revoke(ctx, l.lease); err == nil && rerr != nil {
		err = rerr
	}
	l.stop()
	return err
}

// abandon gives up a campaign: the lease is revoked so its candidate key
// goes at once.
func (l *Leadership) abandon() {
	ctx, cancel := context.WithTimeout(context.Background(), l.s.cfg.dialTimeout)
	defer cancel()
	l.s.client.Revoke(ctx, l.lease)
	l.stop()
}

func (l *Leadership) stop() {
	l.markLost(errors.New("stopped"))
	l.cancel()
	<-l.done
}
