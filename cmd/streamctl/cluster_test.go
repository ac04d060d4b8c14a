package main

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weirstream/weir/internal/proctest"
)

func startCluster(t *testing.T, args ...string) *proctest.Proc {
	t.Helper()
	return startClusterEnv(t, nil, args...)
}

// startClusterEnv starts streamctl with args and env added to the test's
// environment.
func startClusterEnv(t *testing.T, env []string, args ...string) *proctest.Proc {
	t.Helper()
	cmd := exec.Command(streamctlBin, args...)
	cmd.Env = append(os.Environ(), env...)
	return proctest.Start(t, cmd)
}

func taskManagerIDs(t *testing.T, httpAddr string) []string {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/taskmanagers")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		TaskManagers []struct {
			ID    string `json:"id"`
			Slots int    `json:"slots"`
			State string `json:"state"` // LOST ones are listed too
		} `json:"taskmanagers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, tm := range list.TaskManagers {
		if tm.State == "LOST" {
			continue
		}
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
	t.Parallel()
	jm := startCluster(t, "jobmanager", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--data-dir", t.TempDir())
	addr := jm.Line(t, `^jobmanager listening on (\S+)$`)
	httpAddr := jm.Line(t, `^jobmanager http on (\S+)$`)
	tmA := startCluster(t, "taskmanager", "--jobmanager", addr, "--slots", "2", "--id", "tm-a")
	waitTaskManagers(t, httpAddr, "tm-a", 30*time.Second)
	// The second task manager takes the job manager's address from WEIR_JOBMANAGER.
	tmB := startClusterEnv(t, []string{"WEIR_JOBMANAGER=" + addr}, "taskmanager", "--slots", "1", "--id", "tm-b")
	waitTaskManagers(t, httpAddr, "tm-a,tm-b", 30*time.Second)

	_ = tmB.Cmd.Process.Signal(syscall.SIGKILL)
	<-tmB.Done
	if d := waitTaskManagers(t, httpAddr, "tm-a", 10*time.Second); d > 5*time.Second {
		t.Errorf("a SIGKILLed task manager was dropped after %v, want within a few seconds", d)
	}

	_ = jm.Cmd.Process.Signal(syscall.SIGKILL)
	<-jm.Done
	jm2 := startCluster(t, "jobmanager", "--listen", addr, "--http", "127.0.0.1:0")
	jm2.Line(t, `^jobmanager listening on (\S+)$`)
	http2 := jm2.Line(t, `^jobmanager http on (\S+)$`)
	waitTaskManagers(t, http2, "tm-a", 15*time.Second)

	for _, p := range []*proctest.Proc{tmA, jm2} {
		_ = p.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.Done:
		case <-time.After(15 * time.Second):
			t.Fatalf("%v did not stop within 15s of SIGTERM", p.Cmd.Args)
		}
		if code := p.Cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("%v exit code %d after SIGTERM", p.Cmd.Args, code)
		}
	}
}
