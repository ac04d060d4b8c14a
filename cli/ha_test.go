package cli

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/examples/wordcount"
)

// The high-availability flags are refused, with what to do, when they do
// not make a cluster: HA without shared checkpoint storage (a new leader
// could not read the checkpoints), etcd without endpoints, HA options on a
// standalone job manager, an unknown mode, a lease that is not whole
// seconds of at least 2 s (etcd's leases count in seconds).
func TestJobManagerRefusesHighAvailabilityFlagsThatCannotWork(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--ha", "etcd", "--etcd-endpoints", "http://127.0.0.1:1"}, "--ha etcd needs --checkpoint-storage"},
		{[]string{"--ha", "embedded"}, "--ha embedded needs --checkpoint-storage"},
		{[]string{"--ha", "etcd", "--checkpoint-storage", "mem://x"}, "--ha etcd needs --etcd-endpoints"},
		{[]string{"--ha-cluster-id", "x"}, "--ha-cluster-id needs --ha etcd or embedded"},
		{[]string{"--etcd-endpoints", "http://127.0.0.1:1"}, "--etcd-endpoints needs --ha etcd or embedded"},
		{[]string{"--ha", "zookeeper"}, `--ha "zookeeper": want standalone, etcd or embedded`},
		{[]string{"--ha", "embedded", "--etcd-endpoints", "http://127.0.0.1:1", "--checkpoint-storage", "mem://x"}, "--ha embedded runs its own etcd"},
		{[]string{"--ha", "etcd", "--etcd-endpoints", "http://127.0.0.1:1", "--checkpoint-storage", "mem://x", "--etcd-cert", "c.pem"}, "--etcd-cert and --etcd-key go together"},
		{[]string{"--ha", "etcd", "--etcd-endpoints", "http://127.0.0.1:1", "--checkpoint-storage", "mem://x", "--ha-lease-ttl", "1500ms"}, "--ha-lease-ttl 1.5s: want whole seconds, at least 2s"},
		{[]string{"--ha", "embedded", "--checkpoint-storage", "mem://x", "--ha-lease-ttl", "1s"}, "--ha-lease-ttl 1s: want whole seconds, at least 2s"},
		{[]string{"--ha", "etcd", "--etcd-endpoints", "http://127.0.0.1:1", "--checkpoint-storage", "mem://x", "--ha-lease-ttl", "2500ms"}, "--ha-lease-ttl 2.5s: want whole seconds"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, _, err := runCLI(t, append([]string{"jobmanager", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// `local --ha embedded --jobmanagers 2` runs an etcd and two job managers
// in the process: the first leads (its address is printed first) and runs
// the wordcount exactly once; the second is a standby whose REST API
// answers 503 naming the leader.
func TestLocalWithEmbeddedHARunsALeaderAndAStandby(t *testing.T) {
	c := startLocal(t, "--ha", "embedded", "--jobmanagers", "2", "--taskmanagers", "2")
	// The first job manager prints its addresses before it leads (503
	// until then), and the task managers ask who leads before they
	// register.
	leaderHTTP := "http://" + c.addr(t, "jobmanager http on")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var list struct {
			TaskManagers []struct{} `json:"taskmanagers"`
		}
		code, body := httpDo(t, http.MethodGet, leaderHTTP+"/taskmanagers")
		if code == http.StatusOK {
			if err := json.Unmarshal(body, &list); err != nil {
				t.Fatal(err)
			}
			if len(list.TaskManagers) == 2 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /taskmanagers of the leader after 30s: %d %s, want 2 task managers", code, body)
		}
	}
	lines := testLines(300, "ha")
	produceLines(t, c.broker, "lines", lines)
	c.submitWordcount(t, "200ms")
	waitCounted(t, c.broker, "counts", wordcount.Expected(lines))

	var standbyHTTP string
	for deadline := time.Now().Add(30 * time.Second); standbyHTTP == ""; time.Sleep(20 * time.Millisecond) {
		if m := regexp.MustCompile(`(?m)^jobmanager http on \S+\n(?s:.*)^jobmanager http on (\S+)$`).FindStringSubmatch(c.out.String()); m != nil {
			standbyHTTP = m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("local printed one job manager: %q", c.out.String())
		}
	}
	resp, err := http.Get("http://" + standbyHTTP + "/jobs")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "the leader is at "+c.jm) {
		t.Fatalf("the standby's GET /jobs: %d %s; want 503 naming the leader %s", resp.StatusCode, body, c.jm)
	}
	// A client given only the standby's address follows it to the leader.
	m := regexp.MustCompile(`(?m)^jobmanager listening on \S+\n(?s:.*)^jobmanager listening on (\S+)$`).FindStringSubmatch(c.out.String())
	if m == nil || m[1] == c.jm {
		t.Fatalf("local printed no standby control address: %q", c.out.String())
	}
	out, _, err := runCLI(t, "list", "--jobmanager", m[1])
	if err != nil || !strings.Contains(out, "wordcount") {
		t.Fatalf("list --jobmanager STANDBY: %q, %v; want the leader's jobs", out, err)
	}
}
