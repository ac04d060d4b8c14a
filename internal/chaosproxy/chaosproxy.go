// Package chaosproxy is a TCP proxy for tests that cut the network between
// Weir's processes: each process is given a Proxy's address instead of its
// peer's, and the test switches the Proxy between forwarding, dropping every
// connection, and a black hole, then heals it.
//
// It is pure Go and forwards bytes unchanged: one goroutine pair per
// connection (client to target, target to client) and one accept loop.
// It is for tests only.
package chaosproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
)

// Mode is what a Proxy does with connections.
type Mode int

const (
	// Forward passes bytes both ways (the default, and what Heal restores).
	Forward Mode = iota
	// Drop resets (RST) every open connection at once and every new one as
	// soon as it is accepted: peers see "connection reset" at once.
	Drop
	// BlackHole stalls silently: open connections stop forwarding (at most
	// one buffer already read is held, nothing is discarded), new
	// connections are accepted but not connected to the target. Peers see
	// nothing until their own timeouts; at Heal everything held moves on,
	// as TCP retransmission would deliver it after a short partition.
	BlackHole
)

func (m Mode) String() string {
	switch m {
	case Forward:
		return "forward"
	case Drop:
		return "drop"
	case BlackHole:
		return "blackhole"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Opt configures a Proxy.
type Opt interface{ apply(*cfg) }

type cfg struct {
	listen string
}

type optFunc func(*cfg)

func (f optFunc) apply(c *cfg) { f(c) }

// Listen sets the address the Proxy listens on (default 127.0.0.1:0, a free
// port).
func Listen(addr string) Opt { return optFunc(func(c *cfg) { c.listen = addr }) }

// ErrClosed is returned by New's Proxy methods after Close.
var ErrClosed = errors.New("proxy closed")

// Proxy forwards connections from its address to a target address.
type Proxy struct {
	target string
	lis    net.Listener
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	mode   Mode
	open   chan struct{} // closed while the mode is Forward
	conns  map[net.Conn]struct{}
	closed bool
	served int // connections accepted
}

// New listens and forwards every accepted connection to target until
// Close. The target need not be up: a connection the target refuses is
// closed.
func New(target string, opts ...Opt) (*Proxy, error) {
	c := cfg{listen: "127.0.0.1:0"}
	for _, o := range opts {
		o.apply(&c)
	}
	lis, err := net.Listen("tcp", c.listen)
	if err != nil {
		return nil, fmt.Errorf("proxy listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{target: target, lis: lis, ctx: ctx, cancel: cancel, open: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(p.open)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address the Proxy listens on: give it to the client process.
func (p *Proxy) Addr() string { return p.lis.Addr().String() }

// Target is the address the Proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Accepted returns how many connections the Proxy has accepted: a test can
// check that its clients really go through it.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.served
}

// Mode returns the current mode.
func (p *Proxy) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Set switches the mode: Drop resets every open connection; BlackHole
// stalls them; Forward (Heal) resumes what was stalled.
func (p *Proxy) Set(m Mode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || m == p.mode {
		return
	}
	if p.mode == Forward {
		p.open = make(chan struct{})
	}
	p.mode = m
	switch m {
	case Forward:
		close(p.open)
	case Drop:
		for c := range p.conns {
			reset(c)
		}
	}
}

// Heal returns to Forward.
func (p *Proxy) Heal() { p.Set(Forward) }

// Close stops listening, closes every connection and waits for the
// Proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.cancel()
	err := p.lis.Close()
	p.wg.Wait()
	return err
}

// reset closes c with an RST instead of a FIN.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// track adds c to the open connections; false if the Proxy is closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// gate returns the mode and a channel closed when the Proxy forwards.
func (p *Proxy) gate() (Mode, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode, p.open
}

// wait blocks until the Proxy forwards; false if the connection must end
// instead (dropped, or the Proxy closed).
func (p *Proxy) wait(gen chan struct{}) bool {
	for {
		mode, open := p.gate()
		switch mode {
		case Forward:
			return true
		case Drop:
			return false
		}
		select {
		case <-open:
		case <-p.ctx.Done():
			return false
		case <-gen:
			return false
		}
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			c.Close()
			return
		}
		p.mu.Lock()
		p.served++
		p.mu.Unlock()
		if mode, _ := p.gate(); mode == Drop {
			p.untrack(c)
			reset(c)
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve connects c to the target (once the Proxy forwards) and copies
// client to target itself, target to client in a second goroutine.
func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	defer p.untrack(c)
	done := make(chan struct{})
	defer close(done)
	if !p.wait(done) {
		reset(c)
		return
	}
	var d net.Dialer
	up, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		reset(c)
		return
	}
	if !p.track(up) {
		c.Close()
		up.Close()
		return
	}
	defer p.untrack(up)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.copy(c, up, done)
	}()
	p.copy(up, c, done)
	// One direction ended: end the other.
	c.Close()
	up.Close()
}

// copy moves bytes from src to dst, holding each buffer while the Proxy is
// a black hole, until either side fails or the connection is dropped.
func (p *Proxy) copy(dst, src net.Conn, done chan struct{}) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.wait(done) {
				reset(src)
				reset(dst)
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				src.Close()
				return
			}
		}
		if err != nil {
			// EOF or a failure: the caller ends both sides.
			dst.Close()
			return
		}
	}
}
