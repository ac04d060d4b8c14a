package broker

import (
	"context"
	"net"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// gatedListener is the one listener kfake serves. It accepts connections
// from an internal loopback listener at once, and from the client-facing
// listener only once opened: the broker repairs a crashed data dir through
// the internal one before any client sees the state. Connections made
// meanwhile wait in the client-facing listener's backlog.
type gatedListener struct {
	external net.Listener // reports the advertised address
	internal net.Listener

	gate      chan struct{} // closed by open
	openOnce  sync.Once
	closed    chan struct{}
	closeOnce sync.Once
	conns     chan acceptResult // from external, after the gate
	iconns    chan acceptResult // from internal
	wg        sync.WaitGroup
}

type acceptResult struct {
	c   net.Conn
	err error
}

func newGatedListener(external, internal net.Listener) *gatedListener {
	l := &gatedListener{
		external: external, internal: internal,
		gate: make(chan struct{}), closed: make(chan struct{}),
		conns: make(chan acceptResult), iconns: make(chan acceptResult),
	}
	l.wg.Add(2)
	go l.acceptLoop(internal, l.iconns, nil)
	go l.acceptLoop(external, l.conns, l.gate)
	return l
}

func (l *gatedListener) acceptLoop(ln net.Listener, out chan<- acceptResult, gate <-chan struct{}) {
	defer l.wg.Done()
	if gate != nil {
		select {
		case <-gate:
		case <-l.closed:
			return
		}
	}
	for {
		c, err := ln.Accept()
		select {
		case out <- acceptResult{c, err}:
		case <-l.closed:
			if c != nil {
				c.Close()
			}
			return
		}
		if err != nil {
			return
		}
	}
}

// open lets client connections through.
func (l *gatedListener) open() { l.openOnce.Do(func() { close(l.gate) }) }

func (l *gatedListener) Accept() (net.Conn, error) {
	select {
	case r := <-l.iconns:
		return r.c, r.err
	case r := <-l.conns:
		return r.c, r.err
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *gatedListener) Close() error {
	var err error
	l.closeOnce.Do(func() {
		close(l.closed)
		err = l.external.Close()
		if ierr := l.internal.Close(); err == nil {
			err = ierr
		}
		l.wg.Wait()
	})
	return err
}

func (l *gatedListener) Addr() net.Addr { return l.external.Addr() }

// internalClient returns a client that reaches the broker through the
// internal listener only, whatever address metadata advertises.
func (l *gatedListener) internalClient(opts ...kgo.Opt) (*kgo.Client, error) {
	addr := l.internal.Addr().String()
	var d net.Dialer
	return kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(addr),
		kgo.Dialer(func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		}),
	}, opts...)...)
}
