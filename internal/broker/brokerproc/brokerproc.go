// Package brokerproc runs the embedded broker as a separate process for tests
// that must crash it for real: a SIGKILL leaves the data dir exactly as a
// crash of `streamctl broker` would, with no deferred cleanup and no Close.
//
// The child process is the test binary itself: a test package calls Main at
// the top of its TestMain, and Start re-executes the binary with an
// environment variable that makes Main run a broker instead of the tests.
//
// It owns nothing but the child process; it must not be imported by
// non-test code, except weirtest, the test kit (whose users' tests run the
// broker in a child process the same way).
package brokerproc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/zap"

	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/proctest"
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

// Proc is a broker running in a child process: a proctest.Proc (Kill,
// Stop) that printed its address.
type Proc struct {
	*proctest.Proc
	// Addr is the address the broker listens on.
	Addr string
}

// Start runs a broker on dir in a child process (this test binary),
// listening on listen ("127.0.0.1:0" for a free port; pass a previous Proc's
// Addr to restart on the same address), with the given broker configs
// (key=value). It returns once the broker accepts connections. The process
// is killed at cleanup.
func Start(t testing.TB, dir, listen string, configs ...string) *Proc {
	t.Helper()
	return Run(t, Command(dir, listen, configs...))
}

// Command is the command that runs a broker on dir in a child process
// (this test binary, whose TestMain calls Main), listening on listen, with
// the given broker configs (key=value). The child prints "broker listening
// on HOST:PORT" once it accepts connections, and stops cleanly on SIGTERM.
func Command(dir, listen string, configs ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envDir+"="+dir, envListen+"="+listen)
	if len(configs) > 0 {
		cmd.Env = append(cmd.Env, envConfig+"="+strings.Join(configs, ";"))
	}
	return cmd
}

// Run starts cmd, a broker process that prints "broker listening on
// HOST:PORT" as its first stdout line (Start's child, or `streamctl
// broker`), and waits for that line. The process is killed at cleanup.
func Run(t testing.TB, cmd *exec.Cmd) *Proc {
	t.Helper()
	p := proctest.Start(t, cmd)
	return &Proc{Proc: p, Addr: p.Line(t, `^broker listening on (\S+)$`)}
}

// Stderr returns what the process wrote to stderr so far (its log).
func (p *Proc) Stderr() string { return p.Proc.Stderr.String() }

// Stdout returns the stdout lines the process printed after its listening
// line and nobody read yet (up to proctest's buffer).
func (p *Proc) Stdout() string {
	var lines []string
	for {
		select {
		case l := <-p.Out:
			lines = append(lines, l+"\n")
		default:
			return strings.Join(lines, "")
		}
	}
}
