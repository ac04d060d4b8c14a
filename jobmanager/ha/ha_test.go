package ha_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/weirstream/weir/internal/chaosproxy"
	"github.com/weirstream/weir/jobmanager/ha"
)

func startEtcd(t *testing.T) *ha.Embedded {
	t.Helper()
	e, err := ha.StartEmbedded(t.Context(), t.TempDir(), ha.FastForTests())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

func connect(t *testing.T, endpoints []string, cluster string, opts ...ha.Opt) *ha.Services {
	t.Helper()
	s, err := ha.New(t.Context(), endpoints, cluster, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestOneLeaderAtATimeAndADeposedLeadersWritesFail(t *testing.T) {
	e := startEtcd(t)
	ctx := t.Context()
	a := connect(t, e.Endpoints(), "prod", ha.LeaseTTL(4*time.Second))
	b := connect(t, e.Endpoints(), "prod", ha.LeaseTTL(4*time.Second))

	la, err := a.Campaign(ctx, "jm-a:6123")
	if err != nil {
		t.Fatal(err)
	}
	if addr, tok, err := b.Leader(ctx); err != nil || addr != "jm-a:6123" || tok != la.Token() {
		t.Fatalf("leader seen by b: %q %d %v; want jm-a:6123 %d", addr, tok, err, la.Token())
	}
	if err := la.Create(ctx, "jobs/j1/checkpoints/1", []byte("chk-1")); err != nil {
		t.Fatal(err)
	}
	// b campaigns and waits while a leads.
	won := make(chan *ha.Leadership, 1)
	go func() {
		lb, err := b.Campaign(ctx, "jm-b:6123")
		if err != nil {
			t.Error(err)
			close(won)
			return
		}
		won <- lb
	}()
	select {
	case <-won:
		t.Fatal("b became leader while a leads")
	case <-time.After(500 * time.Millisecond):
	}
	if err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	lb := <-won
	if lb == nil {
		t.FailNow()
	}
	defer lb.Resign(context.WithoutCancel(ctx))
	if lb.Token() <= la.Token() {
		t.Errorf("new leader's token %d is not above the old one's %d", lb.Token(), la.Token())
	}
	select {
	case <-la.Lost():
	default:
		t.Error("a's leadership not lost after resigning")
	}
	if err := la.Put(ctx, "jobs/j1/checkpoints/2", []byte("from the deposed leader")); !errors.Is(err, ha.ErrNotLeader) {
		t.Errorf("deposed leader's put: %v, want ErrNotLeader", err)
	}
	if err := lb.Create(ctx, "jobs/j1/checkpoints/2", []byte("chk-2")); err != nil {
		t.Fatal(err)
	}
	if err := lb.Create(ctx, "jobs/j1/checkpoints/2", []byte("again")); !errors.Is(err, ha.ErrExists) {
		t.Errorf("second create: %v, want ErrExists", err)
	}
	var keys []string
	if err := b.List(ctx, "jobs/j1/", func(k string, v []byte) error { keys = append(keys, k+"="+string(v)); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || keys[0] != "jobs/j1/checkpoints/1=chk-1" || keys[1] != "jobs/j1/checkpoints/2=chk-2" {
		t.Errorf("data = %v; want the two checkpoints, the first written by the old leader and kept", keys)
	}
}

func TestTwoClustersOnOneEtcdNeverSeeEachOther(t *testing.T) {
	e := startEtcd(t)
	ctx := t.Context()
	prod := connect(t, e.Endpoints(), "prod")
	staging := connect(t, e.Endpoints(), "staging")
	lp, err := prod.Campaign(ctx, "prod-jm:6123")
	if err != nil {
		t.Fatal(err)
	}
	defer lp.Resign(context.WithoutCancel(ctx))
	ls, err := staging.Campaign(ctx, "staging-jm:6123") // does not wait for prod's leader
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Resign(context.WithoutCancel(ctx))
	if err := lp.Put(ctx, "jobs/j1", []byte("prod job")); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := staging.Get(ctx, "jobs/j1"); err != nil || ok {
		t.Errorf("staging sees prod's job: %v %v", ok, err)
	}
	if addr, _, _ := staging.Leader(ctx); addr != "staging-jm:6123" {
		t.Errorf("staging's leader = %q", addr)
	}
	if _, err := ha.New(ctx, e.Endpoints(), "a/b"); !errors.Is(err, ha.ErrBadCluster) {
		t.Errorf("cluster id with a slash: %v, want ErrBadCluster", err)
	}
}

// TestALeaderCutOffFromEtcdStepsDownBeforeItsLeaseExpires puts a black hole
// between the leader and etcd: it must declare its leadership lost (and
// refuse writes) before etcd expires its lease and lets the standby lead,
// and no write of it may take effect after the new leader's first.
func TestALeaderCutOffFromEtcdStepsDownBeforeItsLeaseExpires(t *testing.T) {
	e := startEtcd(t)
	ctx := t.Context()
	proxy, err := chaosproxy.New(mustHost(t, e.Endpoints()[0]))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	const ttl = 4 * time.Second
	a := connect(t, []string{"http://" + proxy.Addr()}, "prod", ha.LeaseTTL(ttl), ha.DialTimeout(time.Second))
	b := connect(t, e.Endpoints(), "prod", ha.LeaseTTL(ttl))
	la, err := a.Campaign(ctx, "jm-a")
	if err != nil {
		t.Fatal(err)
	}
	won := make(chan *ha.Leadership, 1)
	go func() {
		lb, err := b.Campaign(ctx, "jm-b")
		if err != nil {
			t.Error(err)
		}
		won <- lb
	}()
	// A brief disconnect (under half the TTL) keeps the leadership.
	proxy.Set(chaosproxy.BlackHole)
	time.Sleep(ttl / 5)
	proxy.Heal()
	if err := la.Put(ctx, "k", []byte("a after a brief cut")); err != nil {
		t.Fatalf("leader lost its leadership over a %v cut: %v", ttl/5, err)
	}

	proxy.Set(chaosproxy.BlackHole)
	cut := time.Now()
	// A write sent as the cut begins sits in the black hole; whatever
	// happens to it after the heal, it must not take effect over the new
	// leader's.
	inFlight := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 4*ttl)
		defer cancel()
		inFlight <- la.Put(wctx, "k", []byte("a, sent into the cut"))
	}()
	var lostAt time.Time
	select {
	case <-la.Lost():
		lostAt = time.Now()
	case <-time.After(2 * ttl):
		t.Fatal("leader cut off from etcd never stepped down")
	}
	var lb *ha.Leadership
	select {
	case lb = <-won:
	case <-time.After(4 * ttl):
		t.Fatal("standby never took over")
	}
	if lb == nil {
		t.FailNow()
	}
	defer lb.Resign(context.WithoutCancel(ctx))
	tookOver := time.Now()
	// The leader promises to step down half a TTL after its last renewal;
	// etcd lets the standby lead a whole TTL after it. A quarter of the TTL
	// is left for scheduling on a loaded machine.
	if lostAt.Sub(cut) > ttl*3/4 || !lostAt.Before(tookOver) {
		t.Errorf("old leader stepped down %v after the cut, want within %v and before the standby took over (%v)", lostAt.Sub(cut), ttl*3/4, tookOver.Sub(cut))
	}
	if err := lb.Put(ctx, "k", []byte("b")); err != nil {
		t.Fatal(err)
	}
	proxy.Heal()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := la.Put(wctx, "k", []byte("a, deposed")); !errors.Is(err, ha.ErrNotLeader) {
		t.Errorf("deposed leader's write after healing: %v, want ErrNotLeader", err)
	}
	if err := <-inFlight; err == nil {
		t.Errorf("the write sent into the cut succeeded after the new leader's")
	}
	if v, _, _ := b.Get(ctx, "k"); string(v) != "b" {
		t.Errorf("k = %q after the deposed leader's write, want the new leader's", v)
	}
}

func mustHost(t *testing.T, endpoint string) string {
	t.Helper()
	host := endpoint[len("http://"):]
	if _, _, err := net.SplitHostPort(host); err != nil {
		t.Fatal(err)
	}
	return host
}
