package chaosproxy_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weirstream/weir/internal/chaosproxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer echoes every line back until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return lis.Addr().String()
}

func newProxy(t *testing.T, target string) *chaosproxy.Proxy {
	t.Helper()
	p, err := chaosproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

type client struct {
	c net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{c: c, r: bufio.NewReader(c)}
}

// roundTrip writes line and reads it back.
func (c *client) roundTrip(line string) (string, error) {
	if _, err := c.c.Write([]byte(line + "\n")); err != nil {
		return "", err
	}
	got, err := c.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return got[:len(got)-1], nil
}

func mustEcho(t *testing.T, c *client, line string) {
	t.Helper()
	got, err := c.roundTrip(line)
	if err != nil || got != line {
		t.Fatalf("echo %q: got %q, %v", line, got, err)
	}
}

func TestProxyForwardsBothWays(t *testing.T) {
	p := newProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	for _, l := range []string{"a", "bb", string(make([]byte, 100<<10))} {
		mustEcho(t, c, l)
	}
	mustEcho(t, dial(t, p.Addr()), "second")
	if n := p.Accepted(); n != 2 {
		t.Fatalf("Accepted() = %d, want 2", n)
	}
}

// Drop resets the open connections at once and every new one, until Heal.
func TestDropResetsOpenAndNewConnectionsUntilHealed(t *testing.T) {
	p := newProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	mustEcho(t, c, "before")
	p.Set(chaosproxy.Drop)
	if _, err := c.r.ReadString('\n'); !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
		t.Fatalf("read on a dropped connection: %v, want a reset", err)
	}
	if n, err := net.Dial("tcp", p.Addr()); err == nil { // else reset before the dial returned
		cl := &client{c: n, r: bufio.NewReader(n)}
		if got, err := cl.roundTrip("during"); err == nil {
			t.Fatalf("a new connection during the drop echoed %q", got)
		}
		n.Close()
	}
	p.Heal()
	mustEcho(t, dial(t, p.Addr()), "after")
}

// A black hole accepts and holds bytes without forwarding them or closing
// anything; at Heal the held bytes are delivered, on the open connection
// and on one accepted during the black hole.
func TestBlackHoleStallsSilentlyAndHealDeliversWhatWasHeld(t *testing.T) {
	p := newProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	mustEcho(t, c, "before")
	p.Set(chaosproxy.BlackHole)
	if _, err := c.c.Write([]byte("held\n")); err != nil {
		t.Fatal(err)
	}
	n := dial(t, p.Addr())
	if _, err := n.c.Write([]byte("new\n")); err != nil {
		t.Fatal(err)
	}
	for _, cl := range []*client{c, n} {
		_ = cl.c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if got, err := cl.r.ReadString('\n'); !errors.Is(err, errTimeout(err)) || got != "" {
			t.Fatalf("read through a black hole: %q, %v; want nothing (a timeout)", got, err)
		}
		_ = cl.c.SetReadDeadline(time.Time{})
	}
	if m := p.Mode(); m != chaosproxy.BlackHole {
		t.Fatalf("mode %v", m)
	}
	p.Heal()
	for cl, want := range map[*client]string{c: "held\n", n: "new\n"} {
		if got, err := cl.r.ReadString('\n'); err != nil || got != want {
			t.Fatalf("after heal: %q, %v; want %q", got, err, want)
		}
	}
	mustEcho(t, c, "after")
}

// errTimeout returns err if it is a timeout, so errors.Is matches it, and
// a sentinel otherwise.
func errTimeout(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return err
	}
	return errors.New("not a timeout")
}

// Close ends every connection, stalled ones included, and leaves no
// goroutine (goleak in TestMain).
func TestCloseEndsEveryConnection(t *testing.T) {
	p := newProxy(t, echoServer(t))
	a, b := dial(t, p.Addr()), dial(t, p.Addr())
	mustEcho(t, a, "x")
	p.Set(chaosproxy.BlackHole)
	_, _ = b.c.Write([]byte("y\n"))
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for _, cl := range []*client{a, b} {
		if got, err := cl.r.ReadString('\n'); err == nil {
			t.Fatalf("read after Close: %q", got)
		}
	}
	if err := p.Close(); !errors.Is(err, chaosproxy.ErrClosed) {
		t.Fatalf("second Close: %v, want ErrClosed", err)
	}
}

// A target that refuses connections: the client's connection is reset.
func TestRefusedTargetClosesTheClientConnection(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	p := newProxy(t, addr)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		return // reset before the dial returned
	}
	defer c.Close()
	cl := &client{c: c, r: bufio.NewReader(c)}
	if got, err := cl.roundTrip("x"); err == nil {
		t.Fatalf("echo %q through a proxy to a closed port", got)
	}
}
