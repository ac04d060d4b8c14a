package taskmanager

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// AttemptID names the job attempt a data-plane connection belongs to. A
// sender announces it first on every connection, and a receiver refuses a
// sender of another attempt: ports are reused, and a stale sender (a task
// manager that has not yet seen its attempt fail over) that dials the
// address of its old peer may reach another attempt's receiver there.
type AttemptID struct {
	Job     string
	Attempt int32
}

// String renders the id as job/attempt.
func (a AttemptID) String() string { return fmt.Sprintf("%s/%d", a.Job, a.Attempt) }

// ErrWrongAttempt is returned by a receiver's connection whose sender
// announced another attempt, or announced none.
var ErrWrongAttempt = errors.New("data-plane sender of another attempt")

// ErrConnectionLost is returned by Receiver.Recv for a channel whose
// connection broke (closed or dead) before the receiver stopped.
var ErrConnectionLost = errors.New("data-plane connection lost")

// dataKeepAlive probes an idle data-plane connection, so that a peer whose
// host died or was cut off is seen within about 20 s (5 s idle + 3 probes
// 5 s apart), instead of the system default's minutes: an idle channel
// carries nothing else that would notice.
func dataKeepAlive() net.KeepAliveConfig {
	return net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 5 * time.Second, Count: 3}
}

// DataOpt configures a Receiver.
type DataOpt interface{ apply(*dataCfg) }

type dataCfg struct {
	log       *zap.Logger
	ports     [2]int // ListenPorts: lo, hi; zero: any free port
	advertise string // AdvertiseHost
}

type dataOpt func(*dataCfg)

func (o dataOpt) apply(c *dataCfg) { o(c) }

// DataLogger sets the logger a Receiver reports refused and lost
// connections to (default: none).
func DataLogger(l *zap.Logger) DataOpt { return dataOpt(func(c *dataCfg) { c.log = l }) }

// ListenPorts makes ListenExchange listen on the first free port from lo to
// hi (inclusive) instead of any free port: for a firewall that opens a
// range, or a proxy in front of each port.
func ListenPorts(lo, hi int) DataOpt { return dataOpt(func(c *dataCfg) { c.ports = [2]int{lo, hi} }) }

// AdvertiseHost makes an Exchange announce host (with the port it listens
// on) as its address instead of the host it listens on: for a NAT or a
// proxy between the task managers that forwards the same port.
func AdvertiseHost(host string) DataOpt { return dataOpt(func(c *dataCfg) { c.advertise = host }) }

// FrameKind says what a data-plane frame carries.
type FrameKind byte

// Frame kinds. Data, Barrier and EOS travel in band, in order, on one
// channel and each takes one credit; Open and Credit are the protocol's own.
const (
	FrameData    FrameKind = 1 // a batch of records, encoded by runtime's codecs
	FrameBarrier FrameKind = 2 // a checkpoint barrier (payload: the id)
	FrameEOS     FrameKind = 3 // end of the stream
	frameOpen    FrameKind = 4 // sender -> receiver: a channel starts on this connection
	frameCredit  FrameKind = 5 // receiver -> sender: payload-less, n in the length field
	frameHello   FrameKind = 6 // sender -> receiver, first on a connection: attempt u32, then the job id
)

// Frame is one message of a data-plane channel.
type Frame struct {
	Kind    FrameKind
	Payload []byte
}

// ErrProtocol is returned when a peer breaks the data-plane protocol (e.g.
// sends beyond its credit).
var ErrProtocol = errors.New("data-plane protocol violation")

const headerLen = 9 // kind u8, channel u32, length u32

func writeFrame(w *bufio.Writer, kind FrameKind, ch uint32, n uint32, payload []byte) error {
	var h [headerLen]byte
	h[0] = byte(kind)
	binary.BigEndian.PutUint32(h[1:5], ch)
	binary.BigEndian.PutUint32(h[5:9], n)
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	if _, err := w.Write(payload); err != nil {
		return err
	}
	return w.Flush()
}

func readFrame(r *bufio.Reader) (FrameKind, uint32, []byte, uint32, error) {
	var h [headerLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, 0, nil, 0, err
	}
	kind, ch, n := FrameKind(h[0]), binary.BigEndian.Uint32(h[1:5]), binary.BigEndian.Uint32(h[5:9])
	if kind == frameCredit || kind == frameOpen {
		return kind, ch, nil, n, nil
	}
	if n > 64<<20 {
		return 0, 0, nil, 0, fmt.Errorf("%w: frame of %d bytes", ErrProtocol, n)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, 0, nil, 0, err
	}
	return kind, ch, p, n, nil
}

// Sender is the sending end of data-plane channels to one task manager,
// multiplexed on one TCP connection. Send blocks while the channel has no
// credit: the receiver's bounded buffer is the only queue, so backpressure
// crosses the process boundary and nothing grows without bound.
type Sender struct {
	conn net.Conn
	wmu  sync.Mutex
	w    *bufio.Writer

	mu      sync.Mutex
	credits map[uint32]chan struct{}
	done    chan struct{}
	err     error
}

// DialData connects to the data-plane address of a task manager, as a
// sender of attempt id: the receiver there refuses the connection (closes
// it) unless it receives for the same attempt.
func DialData(ctx context.Context, addr string, id AttemptID) (*Sender, error) {
	d := net.Dialer{KeepAliveConfig: dataKeepAlive()}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial data plane %s: %w", addr, err)
	}
	s := &Sender{conn: conn, w: bufio.NewWriter(conn), credits: map[uint32]chan struct{}{}, done: make(chan struct{})}
	hello := binary.BigEndian.AppendUint32(nil, uint32(id.Attempt))
	hello = append(hello, id.Job...)
	if err := s.write(frameHello, 0, uint32(len(hello)), hello); err != nil {
		conn.Close()
		return nil, err
	}
	go s.readCredits()
	return s, nil
}

func (s *Sender) readCredits() {
	r := bufio.NewReader(s.conn)
	var err error
	for {
		var kind FrameKind
		var ch, n uint32
		if kind, ch, _, n, err = readFrame(r); err != nil {
			break
		}
		if kind != frameCredit {
			err = fmt.Errorf("%w: sender got frame kind %d", ErrProtocol, kind)
			break
		}
		c := s.window(ch)
		for i := uint32(0); i < n; i++ {
			select {
			case c <- struct{}{}:
			default:
				err = fmt.Errorf("%w: credit beyond the window on channel %d", ErrProtocol, ch)
			}
		}
		if err != nil {
			break
		}
	}
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
	close(s.done)
}

// maxWindow bounds the credits a receiver may grant one channel.
const maxWindow = 1 << 16

func (s *Sender) window(ch uint32) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.credits[ch]
	if !ok {
		c = make(chan struct{}, maxWindow)
		s.credits[ch] = c
	}
	return c
}

func (s *Sender) write(kind FrameKind, ch uint32, n uint32, payload []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := writeFrame(s.w, kind, ch, n, payload); err != nil {
		return fmt.Errorf("data plane send: %w", err)
	}
	return nil
}

// Open announces channel ch on this connection; the receiver answers with
// its window of credits.
func (s *Sender) Open(ch uint32) error {
	s.window(ch)
	return s.write(frameOpen, ch, 0, nil)
}

// Send sends f on channel ch, waiting for a credit.
func (s *Sender) Send(ctx context.Context, ch uint32, f Frame) error {
	c := s.window(ch)
	select {
	case <-c:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.done:
		s.mu.Lock()
		err := s.err
		s.mu.Unlock()
		return fmt.Errorf("data plane connection lost: %w", err)
	}
	return s.write(f.Kind, ch, uint32(len(f.Payload)), f.Payload)
}

// Close closes the connection.
func (s *Sender) Close() error {
	err := s.conn.Close()
	<-s.done
	return err
}

// Receiver is the receiving end of data-plane channels: each channel has a
// buffer of window frames, and a frame taken out by Recv returns one credit
// to its sender.
type Receiver struct {
	window   int
	id       AttemptID
	log      *zap.Logger
	stopping atomic.Bool // Serve's context is done: connections end on purpose

	mu    sync.Mutex
	chans map[uint32]*inbox
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

type inbox struct {
	frames chan Frame
	mu     sync.Mutex
	credit func() error // returns one credit to the channel's sender

	lostOnce sync.Once
	lost     chan struct{} // closed when the channel's connection broke
	lostErr  error
}

// lose records that the channel's connection broke with err.
func (b *inbox) lose(err error) {
	b.lostOnce.Do(func() {
		b.lostErr = err
		close(b.lost)
	})
}

func (b *inbox) setCredit(fn func() error) {
	b.mu.Lock()
	b.credit = fn
	b.mu.Unlock()
}

func (b *inbox) returnCredit() error {
	b.mu.Lock()
	fn := b.credit
	b.mu.Unlock()
	if fn == nil {
		return nil
	}
	return fn()
}

// NewReceiver returns a receiver for attempt id granting window credits per
// channel. It refuses every sender that does not announce id.
func NewReceiver(window int, id AttemptID, opts ...DataOpt) *Receiver {
	if window < 1 || window > maxWindow {
		window = 8
	}
	c := dataCfg{log: zap.NewNop()}
	for _, o := range opts {
		o.apply(&c)
	}
	return &Receiver{window: window, id: id, log: c.log, chans: map[uint32]*inbox{}, conns: map[net.Conn]struct{}{}}
}

func (r *Receiver) inbox(ch uint32) *inbox {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.chans[ch]
	if !ok {
		b = &inbox{frames: make(chan Frame, r.window), lost: make(chan struct{})}
		r.chans[ch] = b
	}
	return b
}

// Serve accepts senders on lis until ctx is done.
func (r *Receiver) Serve(ctx context.Context, lis net.Listener) error {
	stop := context.AfterFunc(ctx, func() {
		r.stopping.Store(true)
		lis.Close()
		r.mu.Lock()
		for c := range r.conns {
			c.Close()
		}
		r.mu.Unlock()
	})
	defer stop()
	defer r.wg.Wait()
	for {
		conn, err := lis.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("data plane accept: %w", err)
		}
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.SetKeepAliveConfig(dataKeepAlive())
		}
		r.mu.Lock()
		r.conns[conn] = struct{}{}
		r.mu.Unlock()
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			_ = r.serveConn(conn)
			r.mu.Lock()
			delete(r.conns, conn)
			r.mu.Unlock()
			conn.Close()
		}()
	}
}

// serveConn receives the frames of one sender's connection, once its hello
// named this receiver's attempt. When the connection breaks (closed, or dead
// as keepalive finds) while the receiver runs, every channel it opened
// reports ErrConnectionLost once its buffered frames are taken: a channel
// that ended normally (its end of stream came first) is not read again.
func (r *Receiver) serveConn(conn net.Conn) (err error) {
	rd, w := bufio.NewReader(conn), bufio.NewWriter(conn)
	from := conn.RemoteAddr().String()
	if err := r.hello(rd); err != nil {
		r.log.Warn("data-plane connection refused", zap.String("from", from), zap.Stringer("attempt", r.id), zap.Error(err))
		return err
	}
	var opened []*inbox
	defer func() {
		if r.stopping.Load() || len(opened) == 0 {
			return
		}
		lost := fmt.Errorf("%w: from %s: %w", ErrConnectionLost, from, err)
		for _, b := range opened {
			b.lose(lost)
		}
	}()
	var wmu sync.Mutex
	credit := func(ch uint32, n uint32) error {
		wmu.Lock()
		defer wmu.Unlock()
		return writeFrame(w, frameCredit, ch, n, nil)
	}
	for {
		kind, ch, p, _, err := readFrame(rd)
		if err != nil {
			return err
		}
		b := r.inbox(ch)
		if kind == frameOpen {
			opened = append(opened, b)
			b.setCredit(func() error { return credit(ch, 1) })
			if err := credit(ch, uint32(r.window)); err != nil {
				return err
			}
			continue
		}
		select {
		case b.frames <- Frame{Kind: kind, Payload: p}:
		default:
			return fmt.Errorf("%w: channel %d sent beyond its credit", ErrProtocol, ch)
		}
	}
}

// hello reads a connection's first frame: the sender's attempt, which must
// be this receiver's.
func (r *Receiver) hello(rd *bufio.Reader) error {
	kind, _, p, _, err := readFrame(rd)
	switch {
	case err != nil:
		return err
	case kind != frameHello || len(p) < 4:
		return fmt.Errorf("%w: first frame of kind %d, want the sender's attempt", ErrWrongAttempt, kind)
	}
	got := AttemptID{Job: string(p[4:]), Attempt: int32(binary.BigEndian.Uint32(p[:4]))}
	if got != r.id {
		return fmt.Errorf("%w: sender of %s, receiver of %s", ErrWrongAttempt, got, r.id)
	}
	return nil
}

// Recv returns the next frame of channel ch, returning its credit. Once the
// channel's connection broke and its buffered frames were taken, it
// returns an error wrapping ErrConnectionLost.
func (r *Receiver) Recv(ctx context.Context, ch uint32) (Frame, error) {
	b := r.inbox(ch)
	take := func(f Frame) (Frame, error) {
		// A credit that cannot be returned is not the frame's fault: the
		// sender closed its connection (after its end of stream) or lost
		// it, and then learns so itself.
		_ = b.returnCredit()
		return f, nil
	}
	select {
	case f := <-b.frames:
		return take(f)
	case <-ctx.Done():
		return Frame{}, ctx.Err()
	case <-b.lost:
		select {
		case f := <-b.frames: // frames that came before the loss come first
			return take(f)
		default:
			return Frame{}, b.lostErr
		}
	}
}
