package main

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// clusterProc is a streamctl jobmanager or taskmanager child process.
type clusterProc struct {
	cmd    *exec.Cmd
	done   chan struct{} // closed once the process exited (cmd.ProcessState is set)
	out    chan string   // stdout lines
	stderr syncBuffer
}

func startCluster(t *testing.T, args ...string) *clusterProc {
	t.Helper()
	return startClusterEnv(t, nil, args...)
}

// startClusterEnv starts streamctl with args and env added to the test's
// environment.
func startClusterEnv(t *testing.T, env []string, args ...string) *clusterProc {
	t.Helper()
	p := &clusterProc{cmd: exec.Command(streamctlBin, args...), done: make(chan struct{}), out: make(chan string, 16)}
	p.cmd.Env = append(os.Environ(), env...)
	startProc(t, p)
	return p
}

// startProc starts p.cmd, collecting its stdout lines and stderr; the
// process is killed on cleanup if still running.
func startProc(t *testing.T, p *clusterProc) {
	t.Helper()
	p.cmd.Stderr = &p.stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case p.out <- sc.Text():
			default:
			}
		}
		_ = p.cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
}

func (p *clusterProc) line(t *testing.T, re string) string {
	t.Helper()
	select {
	case l := <-p.out:
		m := regexp.MustCompile(re).FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("stdout line %q, want %s", l, re)
		}
		return m[1]
	case <-time.After(30 * time.Second):
		t.Fatalf("no stdout line %s within 30s", re)
	}
	return ""
}

func taskManagerIDs(t *testing.T, httpAddr string) []string {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/taskmanagers")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var tms []struct {
		ID    string `json:"id"`
		Slots int    `json:"slots"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&tms); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, tm := range tms {
		ids = append(ids, tm.ID)
	}
	return ids
}

func waitTaskManagers(t *testing.T, httpAddr, want string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		got := strings.Join(taskManagerIDs(t, httpAddr), ",")
		if got == want {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("task managers %q after %v, want %q", got, within, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Real processes: a job manager and two task managers register; a SIGKILLed
// task manager is dropped within a few seconds; a task manager reconnects by
// itself to a job manager restarted on the same address; SIGTERM stops each
// cleanly (exit 0).
func TestClusterProcessesRegisterDetectDeathAndReconnect(t *testing.T) {
	jm := startCluster(t, "jobmanager", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--data-dir", t.TempDir())
	addr := jm.line(t, `^jobmanager listening on (\S+)$`)
	httpAddr := jm.line(t, `^jobmanager http on (\S+)$`)
	tmA := startCluster(t, "taskmanager", "--jobmanager", addr, "--slots", "2", "--id", "tm-a")
	waitTaskManagers(t, httpAddr, "tm-a", 30*time.Second)
	// The second task manager takes the job manager's address from WEIR_JOBMANAGER.
	tmB := startClusterEnv(t, []string{"WEIR_JOBMANAGER=" + addr}, "taskmanager", "--slots", "1", "--id", "tm-b")
	waitTaskManagers(t, httpAddr, "tm-a,tm-b", 30*time.Second)

	_ = tmB.cmd.Process.Signal(syscall.SIGKILL)
	<-tmB.done
	if d := waitTaskManagers(t, httpAddr, "tm-a", 10*time.Second); d > 5*time.Second {
		t.Errorf("a SIGKILLed task manager was dropped after %v, want within a few seconds", d)
	}

	_ = jm.cmd.Process.Signal(syscall.SIGKILL)
	<-jm.done
	jm2 := startCluster(t, "jobmanager", "--listen", addr, "--http", "127.0.0.1:0")
	jm2.line(t, `^jobmanager listening on (\S+)$`)
	http2 := jm2.line(t, `^jobmanager http on (\S+)$`)
	waitTaskManagers(t, http2, "tm-a", 15*time.Second)

	for _, p := range []*clusterProc{tmA, jm2} {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			t.Fatalf("%v did not stop within 15s of SIGTERM", p.cmd.Args)
		}
		if code := p.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("%v exit code %d after SIGTERM", p.cmd.Args, code)
		}
	}
}
