// Package proctest runs Weir's processes (streamctl, or a binary built with
// cli.Main) as real child processes for tests: a job manager and task
// managers against a broker, with their output collected, and the client
// commands run one by one as a user would.
//
// It is for tests only. It must not import the packages under test
// (runtime, jobmanager, taskmanager, connectors): it drives binaries.
package proctest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Buffer is a goroutine-safe sink for a process's stderr or a logger.
type Buffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// Sync implements zapcore.WriteSyncer.
func (b *Buffer) Sync() error { return nil }

// Tail returns the last n lines, without the routine "checkpoint completed"
// lines.
func (b *Buffer) Tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var lines []string
	for _, l := range strings.Split(b.buf.String(), "\n") {
		if !strings.Contains(l, "checkpoint completed") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// String returns everything written.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Proc is a child process.
type Proc struct {
	Cmd    *exec.Cmd
	Done   chan struct{} // closed once the process exited (Cmd.ProcessState is set)
	Out    chan string   // stdout lines (dropped when nobody reads)
	Stderr Buffer
}

// Start starts cmd, collecting its stdout lines and stderr; the process is
// killed on cleanup if still running.
func Start(t testing.TB, cmd *exec.Cmd) *Proc {
	t.Helper()
	p := &Proc{Cmd: cmd, Done: make(chan struct{}), Out: make(chan string, 16)}
	p.Cmd.Stderr = &p.Stderr
	stdout, err := p.Cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.Done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case p.Out <- sc.Text():
			default:
			}
		}
		_ = p.Cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = p.Cmd.Process.Kill()
		<-p.Done
	})
	return p
}

// Line waits (30s) for the next stdout line, which must match re, and
// returns re's first group.
func (p *Proc) Line(t testing.TB, re string) string {
	t.Helper()
	select {
	case l := <-p.Out:
		m := regexp.MustCompile(re).FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("stdout line %q, want %s", l, re)
		}
		return m[1]
	case <-p.Done:
		t.Fatalf("%v exited (%v) before printing %s; stderr:\n%s", p.Cmd.Args, p.Cmd.ProcessState, re, p.Stderr.Tail(40))
	case <-time.After(30 * time.Second):
		t.Fatalf("no stdout line %s within 30s", re)
	}
	return ""
}

// Kill SIGKILLs the process and waits for it to exit.
func (p *Proc) Kill(t testing.TB) {
	t.Helper()
	if err := p.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.Done
}

// Stop SIGTERMs the process and checks it exits 0 within 60s.
func (p *Proc) Stop(t testing.TB) {
	t.Helper()
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.Done:
	case <-time.After(60 * time.Second):
		t.Fatalf("%v: no exit within 60s of SIGTERM; stderr:\n%s", p.Cmd.Args, p.Stderr.Tail(40))
	}
	if code := p.Cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("%v: exit code %d after SIGTERM; stderr:\n%s", p.Cmd.Args, code, p.Stderr.Tail(40))
	}
}

// Cluster is a job manager and task managers, each a process of Bin.
type Cluster struct {
	t       testing.TB
	Bin     string
	DataDir string // the job manager's
	JM      *Proc
	// JMAddr is the job manager's control-plane address; fixed after the
	// first start, so a restarted job manager listens there again.
	JMAddr, HTTPAddr string
	TMs              map[string]*Proc
	// JMArgs are added to the job manager's command line (e.g. TLS);
	// ClientArgs to every task manager's and client command's (e.g. the
	// token and the CA). Set them before StartJM.
	JMArgs, ClientArgs []string
}

// NewCluster starts a job manager of bin on a data directory of its own.
func NewCluster(t testing.TB, bin string) *Cluster {
	t.Helper()
	c := NewStoppedCluster(t, bin)
	c.StartJM()
	return c
}

// NewStoppedCluster is NewCluster without starting the job manager: set
// JMArgs and ClientArgs, then StartJM.
func NewStoppedCluster(t testing.TB, bin string) *Cluster {
	return &Cluster{t: t, Bin: bin, DataDir: t.TempDir(), JMAddr: "127.0.0.1:0", TMs: map[string]*Proc{}}
}

// StartJM starts (again) the job manager.
func (c *Cluster) StartJM() {
	c.t.Helper()
	c.StartJMEnv(nil)
}

// StartJMEnv starts (again) the job manager with env added to the
// environment (e.g. WEIR_FAILPOINTS=...).
func (c *Cluster) StartJMEnv(env []string) {
	c.t.Helper()
	cmd := exec.Command(c.Bin, append([]string{"jobmanager", "--listen", c.JMAddr, "--http", "127.0.0.1:0", "--data-dir", c.DataDir, "--log-format", "json"}, c.JMArgs...)...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	c.JM = Start(c.t, cmd)
	c.JMAddr = c.JM.Line(c.t, `^jobmanager listening on (\S+)$`)
	c.HTTPAddr = c.JM.Line(c.t, `^jobmanager http on (\S+)$`)
}

// Logs returns the last n lines of the job manager's and of each task
// manager's stderr, for a failing test's message.
func (c *Cluster) Logs(n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "job manager stderr:\n%s\n", c.JM.Stderr.Tail(n))
	ids := make([]string, 0, len(c.TMs))
	for id := range c.TMs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		fmt.Fprintf(&b, "task manager %s stderr:\n%s\n", id, c.TMs[id].Stderr.Tail(n))
	}
	return b.String()
}

// StartTM starts a task manager with the given id and slots.
func (c *Cluster) StartTM(id string, slots int) *Proc {
	c.t.Helper()
	return c.StartTMWith(id, slots, nil)
}

// StartTMWith starts a task manager with the given id and slots, env added
// to its environment and extra flags after the others (a flag given again
// there, e.g. --jobmanager PROXY, overrides).
func (c *Cluster) StartTMWith(id string, slots int, env []string, extra ...string) *Proc {
	c.t.Helper()
	args := append([]string{"taskmanager", "--jobmanager", c.JMAddr, "--slots", fmt.Sprint(slots), "--id", id, "--log-format", "json"}, c.ClientArgs...)
	args = append(args, extra...)
	cmd := exec.Command(c.Bin, args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	p := Start(c.t, cmd)
	c.TMs[id] = p
	return p
}

// TaskManagerIDs lists the task managers the job manager knows (GET
// /taskmanagers).
func (c *Cluster) TaskManagerIDs() []string {
	c.t.Helper()
	resp, err := http.Get("http://" + c.HTTPAddr + "/taskmanagers")
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		TaskManagers []struct {
			ID    string `json:"id"`
			State string `json:"state"` // LOST ones are listed too
		} `json:"taskmanagers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		c.t.Fatal(err)
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

// WaitTMs waits (30s) until the job manager lists exactly ids
// (comma-separated, sorted).
func (c *Cluster) WaitTMs(ids string) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := strings.Join(c.TaskManagerIDs(), ",")
		if got == ids {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("task managers %q after 30s, want %q", got, ids)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Run runs one client command of Bin (with --jobmanager) to completion and
// returns its stdout.
func (c *Cluster) Run(args ...string) (string, error) {
	c.t.Helper()
	cmd := exec.Command(c.Bin, append(append(args, "--jobmanager", c.JMAddr), c.ClientArgs...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%v: %w: %s", args, err, errb.String())
	}
	return out.String(), nil
}

// Submit submits a job and returns the id it printed.
func (c *Cluster) Submit(args ...string) string {
	c.t.Helper()
	out, err := c.Run(append([]string{"submit"}, args...)...)
	if err != nil {
		c.t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(id) {
		c.t.Fatalf("submit printed %q, want a job id alone", out)
	}
	return id
}

// JobStatus is what status --output json prints.
type JobStatus struct {
	ID                      string `json:"id"`
	Name                    string `json:"name"`
	State                   string `json:"state"`
	Restarts                int    `json:"restarts"`
	LastCompletedCheckpoint uint64 `json:"last_completed_checkpoint"`
	Error                   string `json:"error"`
	StateBackend            string `json:"state_backend"`
}

// Status returns job id's status.
func (c *Cluster) Status(id string) JobStatus {
	c.t.Helper()
	out, err := c.Run("status", id, "--output", "json")
	if err != nil {
		c.t.Fatal(err)
	}
	var st JobStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		c.t.Fatalf("status --output json: %v: %q", err, out)
	}
	return st
}

// WaitStatus polls job id's status (60s) until ok accepts it.
func (c *Cluster) WaitStatus(id, what string, ok func(JobStatus) bool) JobStatus {
	c.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st := c.Status(id)
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("job %s: no %s within 60s: %+v; job manager stderr:\n%s", id, what, st, c.JM.Stderr.Tail(60))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Build builds the main package pkg (as `go build` takes it, relative to
// the calling test's package directory) into a new temporary directory, for
// a TestMain whose tests run the binary. It returns the binary's path and a
// function that removes the directory.
func Build(pkg, name string) (bin string, remove func(), err error) {
	dir, err := os.MkdirTemp("", name+"-test-")
	if err != nil {
		return "", nil, err
	}
	remove = func() { os.RemoveAll(dir) }
	bin = filepath.Join(dir, name)
	gotool, err := exec.LookPath("go") // go test puts its own GOROOT/bin first on PATH
	if err != nil {
		remove()
		return "", nil, fmt.Errorf("build %s: no go tool on PATH: %w", pkg, err)
	}
	build := exec.Command(gotool, "build", "-o", bin, pkg)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		remove()
		return "", nil, fmt.Errorf("build %s: %w", pkg, err)
	}
	return bin, remove, nil
}

// BinEnv returns the environment variable that names a binary of the main
// package called name already built from this tree, which Main then uses
// instead of building its own: WEIR_TEST_BIN_STREAMCTL for "streamctl".
// CI builds streamctl once and sets it, so that the packages whose tests
// run streamctl do not each build (and link) it again.
func BinEnv(name string) string {
	return "WEIR_TEST_BIN_" + strings.ToUpper(name)
}

// prebuilt returns the binary named by name's BinEnv, or "" when it is
// unset; an unusable one is an error, not a reason to build another.
func prebuilt(name string) (string, error) {
	path := os.Getenv(BinEnv(name))
	if path == "" {
		return "", nil
	}
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("%s=%s: want an absolute path (tests run in their package's directory)", BinEnv(name), path)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", BinEnv(name), err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("%s=%s: not an executable file", BinEnv(name), path)
	}
	return path, nil
}

// Main is a TestMain for tests that run a binary: it builds the main package
// pkg (see Build) into *bin, runs m's tests, checks for leaked goroutines
// after a passing run (goleak), removes the binary, and returns the exit
// code: func TestMain(m *testing.M) { os.Exit(proctest.Main(m, ".", "streamctl", &bin)) }.
// When name's BinEnv names a binary, that one is used (and left in place)
// instead of building pkg. ignore are passed to goleak (e.g. the goroutines
// an in-process etcd leaves behind).
func Main(m *testing.M, pkg, name string, bin *string, ignore ...goleak.Option) int {
	b, err := prebuilt(name)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if b == "" {
		built, remove, err := Build(pkg, name)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer remove()
		b = built
	}
	*bin = b
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(ignore...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// DefaultParallel makes n the default of go test's -parallel (how many
// tests that call t.Parallel run at once; GOMAXPROCS otherwise), for a
// TestMain whose tests mostly wait on child processes: their CPU is spent
// in the processes, so more of them than there are cores keep the cores
// busy. A -parallel on the command line wins. Call it first in TestMain
// (it parses the command line).
func DefaultParallel(n int) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		if err := flag.Set("test.parallel", strconv.Itoa(n)); err != nil {
			panic(fmt.Sprintf("proctest: %v", err)) // the testing package registers test.parallel
		}
	}
}
