package cli

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/proctest"
)

// freePort returns a loopback port nothing listens on (as of the call).
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startLocalProcess runs `streamctl local` (this test binary acting as
// streamctl) as a process on dir, its embedded broker on brokerPort, and
// returns it with the broker's and the job manager's addresses.
func startLocalProcess(t *testing.T, dir string, brokerPort int) (p *proctest.Proc, brokerAddr, jm string) {
	t.Helper()
	p = proctest.Start(t, exec.Command(os.Args[0], "local", "--data-dir", dir, "--broker-port", strconv.Itoa(brokerPort),
		"--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--taskmanagers", "2", "--slots", "2"))
	brokerAddr = p.Line(t, `^broker listening on (\S+)$`)
	jm = p.Line(t, `^jobmanager listening on (\S+)$`)
	p.Line(t, `^jobmanager http on (\S+)$`)
	p.Line(t, `^cluster ready: (.*)$`) // its task managers have registered
	return p, brokerAddr, jm
}

// `streamctl local` started again on the same --data-dir brings its
// embedded broker back on the same port (the default 9092, or
// --broker-port), so the job it resumes reaches the broker at the address
// it was submitted with, with the data it left, and carries on: every
// word of the input written before and after the restart is counted
// exactly once (each count 1..n, no duplicate, no gap).
func TestLocalStartedAgainOnItsDataDirResumesItsJobExactlyOnce(t *testing.T) {
	dir, port := t.TempDir(), freePort(t)
	first, brokerAddr, jm := startLocalProcess(t, dir, port)
	if want := "127.0.0.1:" + strconv.Itoa(port); brokerAddr != want {
		t.Fatalf("the embedded broker listens on %s, want %s", brokerAddr, want)
	}
	before, after := testLines(500, "b"), testLines(500, "a")
	produceLines(t, brokerAddr, "lines", before)
	out, _, err := runCLI(t, "submit", "wordcount", "--jobmanager", jm, "--parallelism", "2", "--checkpoint-interval", "200ms",
		"--set", "brokers="+brokerAddr, "--set", "input=lines", "--set", "output=counts")
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	waitCounted(t, brokerAddr, "counts", wordcount.Expected(before))
	first.Stop(t)

	_, brokerAgain, jm := startLocalProcess(t, dir, port)
	if brokerAgain != brokerAddr {
		t.Fatalf("started again, the embedded broker listens on %s, want %s as before", brokerAgain, brokerAddr)
	}
	produceLines(t, brokerAddr, "lines", after)
	waitCounted(t, brokerAddr, "counts", wordcount.Expected(append(before, after...)))
	c := &localCluster{broker: brokerAddr, jm: jm}
	if st := c.status(t, id); st.State != "RUNNING" {
		t.Fatalf("the resumed job: %+v, want RUNNING", st)
	}
}

// A taken broker port is refused with one error that names the flag to
// change.
func TestLocalOnATakenBrokerPortNamesTheFlag(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	_, _, err = runCLI(t, "local", "--broker-port", port, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0")
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:"+port) || !strings.Contains(err.Error(), "--broker-port") {
		t.Fatalf("local on a taken broker port: %v; want an error naming the address and --broker-port", err)
	}
}
