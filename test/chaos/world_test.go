package chaos

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/internal/broker/brokerproc"
	"github.com/weirstream/weir/internal/chaosproxy"
	"github.com/weirstream/weir/internal/proctest"
)

const (
	// heartbeatTimeout is the job manager's (rpc.DefaultHeartbeatTimeout):
	// a task manager silent this long is lost.
	heartbeatTimeout = 3 * time.Second
	// lockDuration is the broker's group.share.record.lock.duration.ms in
	// the suite, shorter than the default so that rounds outlast it.
	lockDuration = 6 * time.Second
	// deliveryLimit is the broker's group.share.delivery.count.limit in
	// the suite: Apache Kafka's default (the embedded broker's is 10), so
	// that restarts and lapses are judged against the budget Kafka users
	// get.
	deliveryLimit = 5
	// slots per task manager: each one alone holds all three jobs
	// (parallelism 2 each).
	slots = 6
	// dataPorts is the size of each task manager's --data-ports range: one
	// port per deployment, three jobs, and attempts overlapping a restart.
	dataPorts = 8
)

var taskManagers = []string{"tm-a", "tm-b"}

// world is the cluster the rounds run on: the broker, the job manager and
// the task managers as processes of streamctl, and the proxies between
// them. Every process is started again on the same data (and address)
// after a fault kills it.
type world struct {
	t          *testing.T
	brokerDir  string
	brokerAddr string // where the broker listens; clients are told brokerProxy's address
	broker     *brokerproc.Proc

	// brokerProxy is between every process and the broker (the broker
	// advertises it); the suite's own clients bypass it (dial).
	brokerProxy *chaosproxy.Proxy
	cl          *proctest.Cluster
	// jmProxy[tm] is between task manager tm and the job manager.
	jmProxy map[string]*chaosproxy.Proxy
	// dataProxy[tm] forwards each port of tm's --data-ports range from
	// tm's advertised data host: every record sent to tm crosses it.
	dataProxy map[string][]*chaosproxy.Proxy
	tmArgs    map[string][]string
	// ended holds the logs of the processes this round replaced (killed,
	// crashed or stopped, then started again), for dump.
	ended []endedProc
}

// endedProc is the log of a process that was replaced.
type endedProc struct {
	name   string
	stderr string
}

// retire keeps the log of process name before it is replaced.
func (w *world) retire(name, stderr string) {
	w.ended = append(w.ended, endedProc{name: name, stderr: stderr})
}

// freePort returns a port free on host now.
func freePort(t *testing.T, host string) int {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// freeRange returns the first port of n consecutive ports free on both
// hosts now.
func freeRange(t *testing.T, n int, hosts ...string) int {
	t.Helper()
	for range 100 {
		base := freePort(t, hosts[0])
		if base+n > 65535 {
			continue
		}
		ok := true
		var held []net.Listener
		for p := base; p < base+n && ok; p++ {
			for _, h := range hosts {
				l, err := net.Listen("tcp", net.JoinHostPort(h, fmt.Sprint(p)))
				if err != nil {
					ok = false
					break
				}
				held = append(held, l)
			}
		}
		for _, l := range held {
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}

func newProxy(t *testing.T, target string, opts ...chaosproxy.Opt) *chaosproxy.Proxy {
	t.Helper()
	p, err := chaosproxy.New(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{t: t, brokerDir: t.TempDir(), jmProxy: map[string]*chaosproxy.Proxy{},
		dataProxy: map[string][]*chaosproxy.Proxy{}, tmArgs: map[string][]string{}}
	w.brokerAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t, "127.0.0.1"))
	w.brokerProxy = newProxy(t, w.brokerAddr)
	w.startBroker()
	w.cl = proctest.NewCluster(t, streamctlBin)
	for i, id := range taskManagers {
		w.jmProxy[id] = newProxy(t, w.cl.JMAddr)
		// The task manager listens on 127.0.0.1 and announces its own
		// loopback address, where a proxy per port forwards to it.
		host := fmt.Sprintf("127.0.0.%d", 11+i)
		base := freeRange(t, dataPorts, "127.0.0.1", host)
		for p := base; p < base+dataPorts; p++ {
			w.dataProxy[id] = append(w.dataProxy[id], newProxy(t, fmt.Sprintf("127.0.0.1:%d", p),
				chaosproxy.Listen(fmt.Sprintf("%s:%d", host, p))))
		}
		w.tmArgs[id] = []string{"--jobmanager", w.jmProxy[id].Addr(), "--data-host", "127.0.0.1",
			"--data-ports", fmt.Sprintf("%d-%d", base, base+dataPorts-1), "--data-advertise", host}
		w.startTM(id, nil)
	}
	w.cl.WaitTMs(strings.Join(taskManagers, ","))
	return w
}

// startBroker starts (again) the broker on its dir and address.
func (w *world) startBroker() {
	w.t.Helper()
	if w.broker != nil {
		w.retire("broker", w.broker.Stderr())
	}
	w.broker = brokerproc.Run(w.t, exec.Command(streamctlBin, "broker", "--listen", w.brokerAddr,
		"--advertise", w.brokerProxy.Addr(), "--data-dir", w.brokerDir, "--log-format", "json",
		"--config", fmt.Sprintf("group.share.record.lock.duration.ms=%d", lockDuration.Milliseconds()),
		"--config", fmt.Sprintf("group.share.delivery.count.limit=%d", deliveryLimit)))
}

// startTM starts (again) task manager id, with env (failpoints) added.
func (w *world) startTM(id string, env []string) {
	w.t.Helper()
	if p := w.cl.TMs[id]; p != nil {
		w.retire(id, p.Stderr.String())
	}
	w.cl.StartTMWith(id, slots, env, w.tmArgs[id]...)
}

// restartJM stops the job manager cleanly and starts it again with env.
func (w *world) restartJM(env []string) {
	w.t.Helper()
	w.cl.JM.Stop(w.t)
	w.startJM(env)
	w.cl.WaitTMs(strings.Join(taskManagers, ","))
}

// startJM starts the job manager again, with env (failpoints) added.
func (w *world) startJM(env []string) {
	w.t.Helper()
	w.retire("jobmanager", w.cl.JM.Stderr.String())
	w.cl.StartJMEnv(env)
}

// restartTM stops task manager id cleanly and starts it again with env.
func (w *world) restartTM(id string, env []string) {
	w.t.Helper()
	w.cl.TMs[id].Stop(w.t)
	w.startTM(id, env)
	w.cl.WaitTMs(strings.Join(taskManagers, ","))
}

// dial connects the suite's own Kafka clients to the broker itself: the
// broker advertises its proxy, which a partition cuts.
func (w *world) dial(ctx context.Context, network, host string) (net.Conn, error) {
	if host == w.brokerProxy.Addr() {
		host = w.brokerAddr
	}
	var d net.Dialer
	return d.DialContext(ctx, network, host)
}

// kafkaOpts are the options of the suite's own clients.
func (w *world) kafkaOpts() []kgo.Opt {
	return []kgo.Opt{kgo.SeedBrokers(w.brokerAddr), kgo.Dialer(w.dial)}
}

// kill SIGKILLs p and waits for its exit.
func kill(t *testing.T, p *proctest.Proc) {
	t.Helper()
	_ = p.Cmd.Process.Signal(syscall.SIGKILL)
	<-p.Done
}

// logs is every process's stderr tail, for a failing round.
func (w *world) logs(n int) string {
	return fmt.Sprintf("broker stderr:\n%s\n%s", tail(w.broker.Stderr(), n), w.cl.Logs(n))
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// partitionTargets are the links a partition can cut.
var partitionTargets = []string{"broker", "jobmanager", "dataplane"}

// proxies returns the proxies of a link: task managers to the broker,
// tm-a to the job manager, or the task managers' data planes (both ways).
func (w *world) proxies(link string) []*chaosproxy.Proxy {
	switch link {
	case "broker":
		return []*chaosproxy.Proxy{w.brokerProxy}
	case "jobmanager":
		return []*chaosproxy.Proxy{w.jmProxy["tm-a"]}
	case "dataplane":
		var ps []*chaosproxy.Proxy
		for _, id := range taskManagers {
			ps = append(ps, w.dataProxy[id]...)
		}
		return ps
	}
	w.t.Fatalf("unknown link %q", link)
	return nil
}
