// Package brokerproc runs the embedded broker as a separate process for tests
// that must crash it for real: a SIGKILL leaves the data dir exactly as a
// crash of `streamctl broker` would, with no deferred cleanup and no Close.
//
// The child process is the test binary itself: a test package calls Main at
// the top of its TestMain, and Start re-executes the binary with an
// environment variable that makes Main run a broker instead of the tests.
//
// It owns nothing but the child process; it must not be imported by
// non-test code.
package brokerproc

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/weirstream/weir/internal/broker"
)

const (
	envDir    = "WEIR_BROKERPROC_DATA_DIR"
	envListen = "WEIR_BROKERPROC_LISTEN"
	envConfig = "WEIR_BROKERPROC_CONFIG" // key=value;key=value
)

// Main runs a broker and exits if this process was started by Start;
// otherwise it returns at once. Call it first in TestMain.
func Main() {
	dir := os.Getenv(envDir)
	if dir == "" {
		return
	}
	os.Exit(serve(dir, os.Getenv(envListen), os.Getenv(envConfig)))
}

func serve(dir, listen, configs string) int {
	log, err := zap.NewDevelopment()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	opts := []broker.Opt{broker.DataDir(dir), broker.Listen(listen), broker.Logger(log)}
	for _, kv := range strings.Split(configs, ";") {
		if kv == "" {
			continue
		}
		k, v, err := broker.ParseConfig(kv)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		opts = append(opts, broker.Config(k, v))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	b, err := broker.Start(ctx, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("broker listening on %s\n", b.Addr())
	<-ctx.Done()
	if err := b.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// Proc is a broker running in a child process.
type Proc struct {
	// Addr is the address the broker listens on.
	Addr string

	cmd    *exec.Cmd
	done   chan struct{} // closed when the process exited and its output is drained
	mu     sync.Mutex
	stdout bytes.Buffer // after the listening line
	stderr bytes.Buffer
}

// Start runs a broker on dir in a child process (this test binary),
// listening on listen ("127.0.0.1:0" for a free port; pass a previous Proc's
// Addr to restart on the same address), with the given broker configs
// (key=value). It returns once the broker accepts connections. The process
// is killed at cleanup.
func Start(t testing.TB, dir, listen string, configs ...string) *Proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envDir+"="+dir, envListen+"="+listen)
	if len(configs) > 0 {
		cmd.Env = append(cmd.Env, envConfig+"="+strings.Join(configs, ";"))
	}
	return Run(t, cmd)
}

// Run starts cmd, a broker process that prints "broker listening on
// HOST:PORT" as its first stdout line (Start's child, or `streamctl
// broker`), and waits for that line. The process is killed at cleanup.
func Run(t testing.TB, cmd *exec.Cmd) *Proc {
	t.Helper()
	p := &Proc{cmd: cmd, done: make(chan struct{})}
	cmd.Stderr = &lockedWriter{mu: &p.mu, b: &p.stderr}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make(chan string, 1)
	go func() {
		defer close(p.done)
		r := bufio.NewReader(stdout)
		l, _ := r.ReadString('\n')
		line <- l
		_, _ = io.Copy(&lockedWriter{mu: &p.mu, b: &p.stdout}, r)
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	select {
	case l := <-line:
		m := regexp.MustCompile(`^broker listening on (\S+)\n$`).FindStringSubmatch(l)
		if m == nil {
			<-p.done
			t.Fatalf("first stdout line = %q, want \"broker listening on HOST:PORT\"; stderr:\n%s", l, p.Stderr())
		}
		p.Addr = m[1]
	case <-time.After(60 * time.Second):
		t.Fatalf("broker process not listening within 60s; stderr:\n%s", p.Stderr())
	}
	return p
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Proc) Kill(t testing.TB) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM (a clean stop) and waits for the process to exit 0.
func (p *Proc) Stop(t testing.TB) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("broker process did not stop within 60s of SIGTERM; stderr:\n%s", p.Stderr())
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("broker process exit code %d after SIGTERM; stderr:\n%s", code, p.Stderr())
	}
}

// Stderr returns what the process wrote to stderr so far (its log).
func (p *Proc) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// Stdout returns what the process wrote to stdout after its listening line.
func (p *Proc) Stdout() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stdout.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(b)
}
