package taskmanager_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/weirstream/weir/taskmanager"
)

// handshakeGoroutines counts the receiver goroutines serving a
// connection, in its handshake or after it.
func handshakeGoroutines(t *testing.T) int {
	t.Helper()
	var b bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&b, 2); err != nil {
		t.Fatal(err)
	}
	return bytes.Count(b.Bytes(), []byte("taskmanager.(*Receiver).serveConn("))
}

// Connections that send only their opening nonce and then nothing (a
// handshake flood) hold at most MaxHandshakes goroutines of the receiver:
// each one beyond closes the oldest. A sender of the attempt that comes
// after them all still gets through, and its records all arrive.
func TestAHandshakeFloodHoldsAtMostMaxHandshakesAndASenderGetsThrough(t *testing.T) {
	id := taskmanager.AttemptID{Job: "job", Attempt: 1}
	const ch, n = 1, 20
	core, logs := observer.New(zap.WarnLevel)
	rcv, addr := serveReceiver(t, 4, id, zap.New(core), ch)
	begin := append(rawHeader(9, 0, 32), make([]byte, 32)...) // a nonce
	flood := 4 * taskmanager.MaxHandshakes
	for range flood {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		if _, err := conn.Write(begin); err != nil {
			t.Fatal(err)
		}
	}
	// Accepted after every connection of the flood.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	snd, err := taskmanager.DialData(ctx, addr, id, secret)
	if err != nil {
		t.Fatalf("the sender did not get through the flood: %v", err)
	}
	defer snd.Close()
	if err := snd.Open(ch); err != nil {
		t.Fatal(err)
	}
	// A cut-off connection's goroutine ends soon after its connection is
	// closed, not at once: on a loaded machine some are still ending.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got := handshakeGoroutines(t)
		if got <= taskmanager.MaxHandshakes+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections of a flood of %d are served after 10 s; want at most %d and the sender's", got, flood, taskmanager.MaxHandshakes)
		}
	}
	sent := make(chan error, 1)
	go func() { sent <- sendAll(t.Context(), snd, ch, n) }()
	recvAll(t, rcv, ch, n)
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	// The cut-off connections are logged, once for their host.
	if refused := logs.FilterMessage("request refused").All(); len(refused) != 1 {
		t.Fatalf("%d refusals logged, want 1: %v", len(refused), logs.All())
	}
}

// failingListener fails its first accepts as a process out of file
// handles does.
type failingListener struct {
	net.Listener
	failures atomic.Int32
}

func (l *failingListener) Accept() (net.Conn, error) {
	if l.failures.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// Accept errors (EMFILE: out of file handles) do not stop Serve: it
// retries after a pause, logs the failure once, and a sender dialling
// meanwhile is accepted once accepting works again.
func TestServeRetriesAcceptErrorsAndASenderGetsThrough(t *testing.T) {
	id := taskmanager.AttemptID{Job: "job", Attempt: 1}
	const ch, n = 1, 20
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &failingListener{Listener: lis}
	fl.failures.Store(5)
	core, logs := observer.New(zap.InfoLevel)
	rcv, err := taskmanager.NewReceiver(4, id, secret, taskmanager.DataLogger(zap.New(core)))
	if err != nil {
		t.Fatal(err)
	}
	rcv.Expect(ch)
	ctx, cancel := context.WithCancel(t.Context())
	var serveErr error
	served := make(chan struct{})
	go func() {
		defer close(served)
		serveErr = rcv.Serve(ctx, fl)
	}()
	defer func() {
		cancel()
		<-served
		if serveErr != nil {
			t.Error(serveErr)
		}
	}()
	dctx, dcancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer dcancel()
	snd, err := taskmanager.DialData(dctx, lis.Addr().String(), id, secret)
	if err != nil {
		select {
		case <-served:
			t.Fatalf("Serve returned on an accept error: %v", serveErr)
		default:
		}
		t.Fatal(err)
	}
	defer snd.Close()
	if err := snd.Open(ch); err != nil {
		t.Fatal(err)
	}
	sent := make(chan error, 1)
	go func() { sent <- sendAll(t.Context(), snd, ch, n) }()
	recvAll(t, rcv, ch, n)
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	failed := logs.FilterMessage("data-plane accept failed; retrying").All()
	if len(failed) != 1 || !strings.Contains(fmt.Sprint(failed[0].ContextMap()["error"]), "too many open files") {
		t.Fatalf("accept failures logged %d times, want once: %v", len(failed), logs.All())
	}
	if len(logs.FilterMessage("data-plane accept works again").All()) != 1 {
		t.Fatalf("the recovery is not logged: %v", logs.All())
	}
}
