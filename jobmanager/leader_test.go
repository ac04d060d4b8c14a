package jobmanager_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/internal/chaosproxy"
	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/jobmanager"
	"github.com/weirstream/weir/jobmanager/ha"
)

// haServer is a highly available job manager served on loopback.
type haServer struct {
	s      *jobmanager.Server
	addr   string
	served chan error
	client weirpb.JobManagerClient
}

func startHAServer(t *testing.T, endpoints []string, st storage.Storage, ttl time.Duration) *haServer {
	t.Helper()
	svc, err := ha.New(t.Context(), endpoints, "test", ha.LeaseTTL(ttl), ha.DialTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	s, err := jobmanager.New(jobmanager.Jobs(numbersRegistry(t)), jobmanager.HighAvailability(svc, st),
		jobmanager.HeartbeatTimeout(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	h := &haServer{s: s, addr: lis.Addr().String(), served: make(chan error, 1)}
	go func() { h.served <- s.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-h.served:
		case <-time.After(30 * time.Second):
			t.Error("Serve did not return 30s after its context ended")
		}
	})
	cc, err := rpc.Dial(h.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	h.client = weirpb.NewJobManagerClient(cc)
	return h
}

func (h *haServer) leader(t *testing.T) *weirpb.LeaderInfo {
	t.Helper()
	info, err := h.client.Leader(t.Context(), &weirpb.LeaderRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// readyz answers the status code of the job manager's GET /readyz, the
// readiness probe that routes a Service to the leader only.
func (h *haServer) readyz(t *testing.T) int {
	t.Helper()
	w := httptest.NewRecorder()
	h.s.HTTPHandler().ServeHTTP(w, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "http://localhost/readyz", nil))
	return w.Code
}

func (h *haServer) waitLeading(t *testing.T, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); !h.leader(t).Leading; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("job manager %s not leading after %v", h.addr, within)
		}
	}
}

// A job manager cut off from etcd (a black hole between the two) steps
// down before its lease expires: Serve returns ErrLeadershipLost (its jobs
// suspended), and only then does the standby lead, finding the job the old
// leader recorded before the cut. A standby meanwhile answers Leader with
// the leader's address and token and refuses the client API, naming the
// leader. (That a deposed leader's writes fail is the HA stores' test.)
func TestAJobManagerCutOffFromEtcdStepsDownBeforeTheStandbyLeads(t *testing.T) {
	const ttl = 4 * time.Second
	e, err := ha.StartEmbedded(t.Context(), t.TempDir(), ha.FastForTests())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	st, err := storage.Open(t.Context(), "mem://shared")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	proxy, err := chaosproxy.New(e.Endpoints()[0][len("http://"):])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })

	a := startHAServer(t, []string{"http://" + proxy.Addr()}, st, ttl)
	a.waitLeading(t, 10*time.Second)
	b := startHAServer(t, e.Endpoints(), st, ttl)
	if info := b.leader(t); info.Leading || info.LeaderAddress != a.addr || info.Token != a.leader(t).Token {
		t.Fatalf("standby says %+v; want not leading, the leader at %s", info, a.addr)
	}
	if code := a.readyz(t); code != http.StatusOK {
		t.Fatalf("the leader's GET /readyz: %d, want 200", code)
	}
	if code := b.readyz(t); code != http.StatusServiceUnavailable {
		t.Fatalf("the standby's GET /readyz: %d, want 503", code)
	}
	_, err = b.client.ListJobs(t.Context(), &weirpb.ListJobsRequest{})
	if err == nil || !strings.Contains(err.Error(), "standby") || !strings.Contains(err.Error(), a.addr) {
		t.Fatalf("standby's ListJobs: %v; want a refusal naming the leader %s", err, a.addr)
	}
	// A job submitted to the leader.
	register(t, a.addr, "tm-1", 1)
	waitFor(t, a.s, "registered task manager", func(tms []jobmanager.TaskManager) bool { return len(tms) == 1 })
	id, err := a.s.Submit(t.Context(), "numbers", nil, time.Second, "")
	if err != nil {
		t.Fatal(err)
	}

	proxy.Set(chaosproxy.BlackHole)
	var lost error
	select {
	case lost = <-a.served:
	case <-time.After(2 * ttl):
		t.Fatal("the leader cut off from etcd never stepped down")
	}
	a.served <- lost // for the cleanup
	if !errors.Is(lost, jobmanager.ErrLeadershipLost) {
		t.Fatalf("Serve of the cut-off leader: %v, want ErrLeadershipLost", lost)
	}
	if b.leader(t).Leading {
		t.Fatal("the standby led before the old leader stepped down")
	}
	b.waitLeading(t, 4*ttl)
	if code := b.readyz(t); code != http.StatusOK {
		t.Fatalf("the new leader's GET /readyz: %d, want 200", code)
	}
	proxy.Heal()
	jobs, err := b.client.ListJobs(t.Context(), &weirpb.ListJobsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs.Jobs) != 1 || jobs.Jobs[0].Id != id {
		t.Fatalf("the new leader lists %v; want only job %s, submitted before the cut", jobs.Jobs, id)
	}
	if info := b.leader(t); info.Token <= 0 {
		t.Fatalf("new leader's token %d", info.Token)
	}
}

// A job manager whose etcd does not answer says so: a warning naming the
// endpoints and the error within seconds (a campaign alone would wait in
// silence for ever), and its refusals (the client API, REST) and /readyz
// say that etcd is unreachable.
func TestAJobManagerWhoseEtcdIsUnreachableSaysSoWithinSeconds(t *testing.T) {
	const endpoint = "http://127.0.0.1:1"
	svc, err := ha.New(t.Context(), []string{endpoint}, "test", ha.DialTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	st, err := storage.Open(t.Context(), "mem://shared")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	core, logs := observer.New(zapcore.WarnLevel)
	s, err := jobmanager.New(jobmanager.Jobs(numbersRegistry(t)), jobmanager.HighAvailability(svc, st),
		jobmanager.Logger(zap.New(core)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		<-served
	})
	start := time.Now()
	for {
		if l := logs.FilterMessageSnippet("etcd is unreachable").All(); len(l) > 0 {
			if f := l[0].ContextMap(); !strings.Contains(fmt.Sprint(f["endpoints"]), "127.0.0.1:1") || !strings.Contains(fmt.Sprint(f["error"]), "etcd unreachable at "+endpoint) {
				t.Fatalf("the warning %q %v names neither the endpoints nor the error", l[0].Message, f)
			}
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("no warning 10 s after the job manager started; logged %v", logs.All())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("warned %v after the start", time.Since(start).Round(time.Millisecond))

	w := httptest.NewRecorder()
	s.HTTPHandler().ServeHTTP(w, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "http://localhost/readyz", nil))
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "etcd unreachable at "+endpoint) {
		t.Fatalf("/readyz: %d %s; want 503 saying etcd is unreachable", w.Code, w.Body)
	}
	w = httptest.NewRecorder()
	s.HTTPHandler().ServeHTTP(w, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "http://localhost/jobs", nil))
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "etcd unreachable") {
		t.Fatalf("GET /jobs: %d %s; want 503 saying etcd is unreachable", w.Code, w.Body)
	}
	cc, err := rpc.Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	_, err = weirpb.NewJobManagerClient(cc).ListJobs(t.Context(), &weirpb.ListJobsRequest{})
	if st, _ := status.FromError(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "etcd unreachable at "+endpoint) {
		t.Fatalf("ListJobs: %v; want Unavailable saying etcd is unreachable", err)
	}
}
