package taskmanager

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/weirstream/weir/internal/rpc"
)

// The data plane between task managers (docs/architecture.md, "Data
// plane"). Every connection is bound to one attempt of one job by a
// handshake before it carries anything: the sender sends a fresh nonce, the
// receiver one of its own, the sender answers with the attempt and an
// HMAC-SHA256 over both nonces, the attempt and (over TLS) the session's exported
// keying material, keyed with the attempt's secret that the job manager
// gave every task manager of the attempt with its deployment; the receiver
// answers with its own MAC, so each side knows the other holds the secret.
// A stranger, or a task manager of another attempt, is refused and logged
// (once per source and interval), and nothing it sent reaches a task.
// After the handshake a sender may open only the channels the receiving
// deployment declared, each once, and send only on channels it opened.
// Every frame's length is checked before anything is allocated for it.

// AttemptID names the job attempt a data-plane connection belongs to. A
// sender proves it belongs to it first on every connection, and a receiver
// refuses a sender of another attempt: ports are reused, and a stale sender
// (a task manager that has not yet seen its attempt fail over) that dials
// the address of its old peer may reach another attempt's receiver there.
type AttemptID struct {
	Job     string
	Attempt int32
}

// String renders the id as job/attempt.
func (a AttemptID) String() string { return fmt.Sprintf("%s/%d", a.Job, a.Attempt) }

// ErrWrongAttempt is returned by a receiver's connection whose sender
// announced another attempt, or announced none.
var ErrWrongAttempt = errors.New("data-plane sender of another attempt")

// ErrNotAuthenticated is returned for a data-plane peer that did not prove
// it knows the attempt's secret.
var ErrNotAuthenticated = errors.New("data-plane peer did not prove the attempt's secret")

// ErrNoSecret is returned when a data-plane end is given no secret (or one
// shorter than MinSecretLen).
var ErrNoSecret = errors.New("data plane needs the attempt's secret")

// ErrUndeclaredChannel is returned by Recv, and refuses a sender's open,
// for a channel the deployment did not declare (Receiver.Expect).
var ErrUndeclaredChannel = errors.New("data-plane channel not declared by the deployment")

// ErrFrameTooLarge is returned for a data-plane frame beyond MaxFrameSize.
var ErrFrameTooLarge = errors.New("data-plane frame too large")

// ErrConnectionLost is returned by Receiver.Recv for a channel whose
// connection broke (closed or dead) before the receiver stopped.
var ErrConnectionLost = errors.New("data-plane connection lost")

// MinSecretLen is the shortest attempt secret a data-plane end accepts (the
// job manager sends 32 random bytes).
const MinSecretLen = 16

// MaxFrameSize bounds one data-plane frame: a message (a batch of records
// as runtime encodes it) larger than this cannot be sent, and a receiver
// refuses a frame announcing more before allocating anything for it.
// Batches are at most the job's batch size in records, so only records of
// several MiB each come near it.
const MaxFrameSize = 64 << 20

// maxHandshakeFrame bounds the frames of the handshake, which come before
// the peer is known: a nonce, MACs, the job id.
const maxHandshakeFrame = 4 << 10

// handshakeTimeout bounds the handshake: a peer that connects and says
// nothing is cut off. A sender's handshake takes a few round trips.
const handshakeTimeout = 10 * time.Second

// MaxHandshakes bounds the connections a Receiver holds in their handshake,
// before the peer proved anything: when one more arrives, the one that
// has waited longest is closed. A sender's handshake takes milliseconds,
// so a flood of connections that say nothing costs at most this many
// goroutines and file handles, and a sender still gets through unless the
// flood opens this many connections during its handshake.
const MaxHandshakes = 32

// Accept errors (out of file handles, say) are retried after a pause that
// doubles from acceptRetryMin up to acceptRetryMax, as net/http's
// Server.Serve does, and logged at most once per acceptLogInterval.
const (
	acceptRetryMin    = 5 * time.Millisecond
	acceptRetryMax    = time.Second
	acceptLogInterval = 10 * time.Second
)

const (
	nonceLen = 32
	macLen   = sha256.Size
	// tlsExporterLabel labels the keying material exported from a TLS
	// data-plane session into the handshake's MACs (RFC 5705).
	tlsExporterLabel = "EXPORTER-weir-data-plane"
)

// dataKeepAlive probes an idle data-plane connection, so that a peer whose
// host died or was cut off is seen within about 20 s (5 s idle + 3 probes
// 5 s apart), instead of the system default's minutes: an idle channel
// carries nothing else that would notice.
func dataKeepAlive() net.KeepAliveConfig {
	return net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 5 * time.Second, Count: 3}
}

// DataOpt configures a data-plane end (Receiver, DialData, ListenExchange).
type DataOpt interface{ apply(*dataCfg) }

type dataCfg struct {
	log       *zap.Logger
	ports     [2]int // ListenPorts: lo, hi; zero: any free port
	advertise string // AdvertiseHost
	rejects   *rpc.RejectLog
	tlsCert   *tls.Certificate
}

type dataOpt func(*dataCfg)

func (o dataOpt) apply(c *dataCfg) { o(c) }

func newDataCfg(opts []DataOpt) dataCfg {
	c := dataCfg{log: zap.NewNop()}
	for _, o := range opts {
		o.apply(&c)
	}
	if c.rejects == nil {
		c.rejects = rpc.NewRejectLog(c.log, refusalLogInterval)
	}
	return c
}

// refusalLogInterval is how often a refused data-plane source is logged at
// most.
const refusalLogInterval = time.Minute

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

// DataRejections logs refused data-plane connections to l (default: a log
// of the DataLogger's, at most once per source host a minute). A task
// manager shares one among its deployments.
func DataRejections(l *rpc.RejectLog) DataOpt { return dataOpt(func(c *dataCfg) { c.rejects = l }) }

// DataTLS runs the data plane over TLS 1.3, the receiver presenting cert
// (NewDataCertificate makes one). A sender does not check cert against a
// CA: the handshake's MACs cover the TLS session's exported keying
// material, so a session completes only between two ends that know the
// attempt's secret, and nobody in between can read or change it. A TLS
// receiver refuses a plaintext sender, and the reverse.
func DataTLS(cert tls.Certificate) DataOpt { return dataOpt(func(c *dataCfg) { c.tlsCert = &cert }) }

// NewDataCertificate makes a self-signed ECDSA P-256 certificate for
// DataTLS, valid for a year.
func NewDataCertificate() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("data-plane key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("data-plane certificate: %w", err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: "weir data plane"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("data-plane certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// FrameKind says what a data-plane frame carries.
type FrameKind byte

// Frame kinds. Data, Barrier and EOS travel in band, in order, on one
// channel and each takes one credit; the others are the protocol's own.
const (
	FrameData      FrameKind = 1 // a batch of records, encoded by runtime's codecs
	FrameBarrier   FrameKind = 2 // a checkpoint barrier (payload: the id)
	FrameEOS       FrameKind = 3 // end of the stream
	frameOpen      FrameKind = 4 // sender -> receiver: a channel starts on this connection
	frameCredit    FrameKind = 5 // receiver -> sender: payload-less, n in the length field
	frameHello     FrameKind = 6 // sender -> receiver: attempt u32, MAC, then the job id
	frameChallenge FrameKind = 7 // receiver -> sender, its first frame: nonce
	frameWelcome   FrameKind = 8 // receiver -> sender: the receiver's MAC
	frameBegin     FrameKind = 9 // sender -> receiver, first on a connection: nonce
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

// readFrame reads one frame whose payload is at most limit bytes: a longer
// one is refused from its header, before anything is allocated for it, and
// the payload's buffer grows with the bytes that actually came, so a peer
// announcing a large frame and sending little costs little.
func readFrame(r *bufio.Reader, limit uint32) (FrameKind, uint32, []byte, uint32, error) {
	var h [headerLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, 0, nil, 0, err
	}
	kind, ch, n := FrameKind(h[0]), binary.BigEndian.Uint32(h[1:5]), binary.BigEndian.Uint32(h[5:9])
	if kind == frameCredit || kind == frameOpen {
		return kind, ch, nil, n, nil
	}
	if n > limit {
		return 0, 0, nil, 0, fmt.Errorf("%w: %w: frame of %d bytes (kind %d, channel %d), at most %d", ErrProtocol, ErrFrameTooLarge, n, kind, ch, limit)
	}
	p, err := readPayload(r, int(n))
	if err != nil {
		return 0, 0, nil, 0, err
	}
	return kind, ch, p, n, nil
}

// readPayload reads n bytes, growing its buffer (from 64 KiB, doubling) as
// they come rather than allocating n up front.
func readPayload(r io.Reader, n int) ([]byte, error) {
	p := make([]byte, 0, min(n, 64<<10))
	for len(p) < n {
		if len(p) == cap(p) {
			p = slices.Grow(p, min(n-len(p), cap(p)))
		}
		k, err := r.Read(p[len(p):min(cap(p), n)])
		p = p[:len(p)+k]
		if err != nil && len(p) < n {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	return p, nil
}

// handshakeMAC is the MAC a data-plane end of role ("sender", "receiver")
// proves the attempt's secret with: over both nonces, the attempt, and the
// TLS session's exported keying material (binding; nil in plaintext), each
// length-prefixed.
func handshakeMAC(secret []byte, role string, id AttemptID, nonceR, nonceS, binding []byte) []byte {
	m := hmac.New(sha256.New, secret)
	for _, part := range [][]byte{[]byte("weir data plane v1"), []byte(role), nonceR, nonceS,
		binary.BigEndian.AppendUint32(nil, uint32(id.Attempt)), []byte(id.Job), binding} {
		var l [4]byte
		binary.BigEndian.PutUint32(l[:], uint32(len(part)))
		m.Write(l[:])
		m.Write(part)
	}
	return m.Sum(nil)
}

// tlsBinding returns the keying material of conn's TLS session for the
// handshake's MACs (nil for a plaintext connection).
func tlsBinding(conn net.Conn) ([]byte, error) {
	tc, ok := conn.(*tls.Conn)
	if !ok {
		return nil, nil
	}
	cs := tc.ConnectionState()
	b, err := cs.ExportKeyingMaterial(tlsExporterLabel, nil, 32)
	if err != nil {
		return nil, fmt.Errorf("data-plane TLS binding: %w", err)
	}
	return b, nil
}

func checkSecret(secret []byte) error {
	if len(secret) < MinSecretLen {
		return fmt.Errorf("%w (%d bytes, at least %d)", ErrNoSecret, len(secret), MinSecretLen)
	}
	return nil
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
// sender of attempt id holding the attempt's secret: the receiver there
// refuses the connection (closes it) unless it receives for the same
// attempt, and DialData fails unless the receiver proves it holds the same
// secret.
func DialData(ctx context.Context, addr string, id AttemptID, secret []byte, opts ...DataOpt) (*Sender, error) {
	if err := checkSecret(secret); err != nil {
		return nil, err
	}
	c := newDataCfg(opts)
	d := net.Dialer{KeepAliveConfig: dataKeepAlive()}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial data plane %s: %w", addr, err)
	}
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	stop := context.AfterFunc(hctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	conn, err = senderHandshake(hctx, conn, c, id, secret)
	if !stop() || err != nil {
		conn.Close()
		if err == nil || hctx.Err() != nil {
			err = errors.Join(err, context.Cause(hctx))
		}
		return nil, fmt.Errorf("data plane %s: %w", addr, err)
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("data plane %s: %w", addr, err)
	}
	s := &Sender{conn: conn, w: bufio.NewWriter(conn), credits: map[uint32]chan struct{}{}, done: make(chan struct{})}
	go s.readCredits(bufio.NewReader(conn))
	return s, nil
}

// senderHandshake runs the sender's side of the handshake on conn (over
// TLS if c says so) and returns the connection to use.
func senderHandshake(ctx context.Context, conn net.Conn, c dataCfg, id AttemptID, secret []byte) (net.Conn, error) {
	if c.tlsCert != nil {
		// The peer's certificate is not checked against a CA: the MACs
		// below cover this session's keying material (see DataTLS).
		tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}) //nolint:gosec // channel binding authenticates the peer
		if err := tc.HandshakeContext(ctx); err != nil {
			return conn, fmt.Errorf("TLS: %w", err)
		}
		conn = tc
	}
	binding, err := tlsBinding(conn)
	if err != nil {
		return conn, err
	}
	rd, w := bufio.NewReader(conn), bufio.NewWriter(conn)
	nonceS := make([]byte, nonceLen)
	_, _ = rand.Read(nonceS)
	if err := writeFrame(w, frameBegin, 0, nonceLen, nonceS); err != nil {
		return conn, err
	}
	kind, _, nonceR, _, err := readFrame(rd, maxHandshakeFrame)
	switch {
	case err != nil:
		return conn, fmt.Errorf("%w: refused by the receiver (%w)", ErrNotAuthenticated, err)
	case kind != frameChallenge || len(nonceR) != nonceLen:
		return conn, fmt.Errorf("%w: the receiver's first frame is of kind %d, want a challenge", ErrProtocol, kind)
	}
	hello := binary.BigEndian.AppendUint32(nil, uint32(id.Attempt))
	hello = append(hello, handshakeMAC(secret, "sender", id, nonceR, nonceS, binding)...)
	hello = append(hello, id.Job...)
	if err := writeFrame(w, frameHello, 0, uint32(len(hello)), hello); err != nil {
		return conn, err
	}
	kind, _, mac, _, err := readFrame(rd, maxHandshakeFrame)
	switch {
	case err != nil:
		return conn, fmt.Errorf("%w: refused by the receiver (%w)", ErrNotAuthenticated, err)
	case kind != frameWelcome:
		return conn, fmt.Errorf("%w: the receiver answered with a frame of kind %d, want its proof", ErrProtocol, kind)
	case !hmac.Equal(mac, handshakeMAC(secret, "receiver", id, nonceR, nonceS, binding)):
		return conn, fmt.Errorf("%w: the receiver's proof is wrong", ErrNotAuthenticated)
	}
	if rd.Buffered() > 0 {
		return conn, fmt.Errorf("%w: the receiver sent frames before any channel opened", ErrProtocol)
	}
	return conn, nil
}

// readCredits takes the receiver's credits until the connection ends or
// the receiver breaks the protocol: the first violation ends the
// connection.
func (s *Sender) readCredits(r *bufio.Reader) {
	var err error
	for err == nil {
		var kind FrameKind
		var ch, n uint32
		if kind, ch, _, n, err = readFrame(r, 0); err != nil {
			break
		}
		err = s.credit(kind, ch, n)
	}
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
	s.conn.Close()
	close(s.done)
}

// credit adds n credits to channel ch, an opened channel whose window has
// room for all n; anything else is a protocol violation, and no credit of
// the frame is granted.
func (s *Sender) credit(kind FrameKind, ch, n uint32) error {
	if kind != frameCredit {
		return fmt.Errorf("%w: sender got frame kind %d", ErrProtocol, kind)
	}
	s.mu.Lock()
	c, ok := s.credits[ch]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: credit for channel %d, which this sender did not open", ErrProtocol, ch)
	}
	if n > uint32(cap(c)-len(c)) {
		return fmt.Errorf("%w: %d credits beyond the window on channel %d", ErrProtocol, n, ch)
	}
	for range n {
		select {
		case c <- struct{}{}:
		default: // only Send takes credits: the room checked above is there
			return fmt.Errorf("%w: credit beyond the window on channel %d", ErrProtocol, ch)
		}
	}
	return nil
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
// its window of credits, or closes the connection if the channel is not
// one its deployment declared or another sender opened it already.
func (s *Sender) Open(ch uint32) error {
	s.window(ch)
	return s.write(frameOpen, ch, 0, nil)
}

// Send sends f on channel ch, waiting for a credit. A payload beyond
// MaxFrameSize is an error wrapping ErrFrameTooLarge.
func (s *Sender) Send(ctx context.Context, ch uint32, f Frame) error {
	if len(f.Payload) > MaxFrameSize {
		return fmt.Errorf("%w: a message of %d bytes on channel %d, at most %d: lower the job's batch size", ErrFrameTooLarge, len(f.Payload), ch, MaxFrameSize)
	}
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

// Receiver is the receiving end of data-plane channels: each channel the
// deployment declared (Expect) has a buffer of window frames, and a frame
// taken out by Recv returns one credit to its sender.
type Receiver struct {
	window   int
	id       AttemptID
	secret   []byte
	c        dataCfg
	log      *zap.Logger
	stopping atomic.Bool // Serve's context is done: connections end on purpose

	mu    sync.Mutex
	chans map[uint32]*inbox // the declared channels
	conns map[net.Conn]struct{}
	// pending are the connections in their handshake, oldest first
	// (at most MaxHandshakes).
	pending []*pendingConn
	wg      sync.WaitGroup
}

// pendingConn is a connection in its handshake; cut is set (under
// Receiver.mu) when it was closed to make room for a newer one.
type pendingConn struct {
	conn net.Conn
	cut  bool
}

type inbox struct {
	frames chan Frame
	opened bool // a sender opened the channel (under Receiver.mu)
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
// channel. It refuses every sender that does not prove it belongs to id
// with secret (at least MinSecretLen bytes, else ErrNoSecret), and every
// channel not declared with Expect.
func NewReceiver(window int, id AttemptID, secret []byte, opts ...DataOpt) (*Receiver, error) {
	if err := checkSecret(secret); err != nil {
		return nil, err
	}
	if window < 1 || window > maxWindow {
		window = 8
	}
	c := newDataCfg(opts)
	return &Receiver{window: window, id: id, secret: slices.Clone(secret), c: c, log: c.log, chans: map[uint32]*inbox{},
		conns: map[net.Conn]struct{}{}}, nil
}

// Expect declares channels chs: a sender may open each once, and Recv
// takes their frames. Declare every channel before a sender may open it.
func (r *Receiver) Expect(chs ...uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ch := range chs {
		if r.chans[ch] == nil {
			r.chans[ch] = &inbox{frames: make(chan Frame, r.window), lost: make(chan struct{})}
		}
	}
}

// inbox returns declared channel ch's inbox, nil if ch is not declared.
func (r *Receiver) inbox(ch uint32) *inbox {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.chans[ch]
}

// open claims declared channel ch for the connection opening it: a channel
// opens once per receiver, so no second sender takes its credits.
func (r *Receiver) open(ch uint32) (*inbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.chans[ch]
	switch {
	case b == nil:
		return nil, fmt.Errorf("%w: %w: open of channel %d", ErrProtocol, ErrUndeclaredChannel, ch)
	case b.opened:
		return nil, fmt.Errorf("%w: open of channel %d, which another sender opened already", ErrProtocol, ch)
	}
	b.opened = true
	return b, nil
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
	var (
		delay     time.Duration // the pause before the next accept after an error
		logged    time.Time     // when an accept error was last logged
		failures  int           // accept errors since
		lastError error
	)
	for {
		conn, err := lis.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("data plane accept: %w", err)
			}
			// Out of file handles, or another passing failure: returning
			// would leave the port listening but never accepting, and
			// every sender of the attempt hanging. Retry, as net/http's
			// Server.Serve does.
			delay = min(max(2*delay, acceptRetryMin), acceptRetryMax)
			failures++
			lastError = err
			if now := time.Now(); now.Sub(logged) >= acceptLogInterval {
				r.log.Warn("data-plane accept failed; retrying", zap.Stringer("attempt", r.id), zap.Error(err),
					zap.Int("failures", failures), zap.Duration("retry_in", delay))
				logged, failures = now, 0
			}
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil
			}
			continue
		}
		if delay > 0 {
			r.log.Info("data-plane accept works again", zap.Stringer("attempt", r.id), zap.Int("failures_since_logged", failures),
				zap.NamedError("last_error", lastError))
			delay, failures = 0, 0
		}
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.SetKeepAliveConfig(dataKeepAlive())
		}
		p := &pendingConn{conn: conn}
		r.mu.Lock()
		r.conns[conn] = struct{}{}
		if len(r.pending) >= MaxHandshakes {
			// Room for the newest: the oldest has had the longest to
			// prove itself.
			old := r.pending[0]
			r.pending = slices.Delete(r.pending, 0, 1)
			old.cut = true
			old.conn.Close()
			r.c.rejects.Rejected(old.conn.RemoteAddr().String(), "data plane of "+r.id.String(),
				fmt.Sprintf("data-plane connection cut off in its handshake: more than %d connections were in theirs", MaxHandshakes))
		}
		r.pending = append(r.pending, p)
		r.mu.Unlock()
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			_ = r.serveConn(p)
			r.mu.Lock()
			delete(r.conns, conn)
			r.mu.Unlock()
			conn.Close()
		}()
	}
}

// handshaken takes p off the connections in their handshake and reports
// whether it was cut off to make room.
func (r *Receiver) handshaken(p *pendingConn) (cut bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i := slices.Index(r.pending, p); i >= 0 {
		r.pending = slices.Delete(r.pending, i, i+1)
	}
	return p.cut
}

// serveConn receives the frames of one sender's connection, once the
// handshake proved it a sender of this receiver's attempt. A connection
// refused before that is logged (rate-limited) and touches no channel.
// When the connection of a proven sender breaks (closed, dead as
// keepalive finds, or closed for breaking the protocol) while the receiver
// runs, every channel it opened reports ErrConnectionLost once its
// buffered frames are taken: a channel that ended normally (its end of
// stream came first) is not read again.
func (r *Receiver) serveConn(p *pendingConn) (err error) {
	conn := p.conn
	from := conn.RemoteAddr().String()
	_ = conn.SetDeadline(time.Now().Add(handshakeTimeout))
	conn, rd, w, err := r.handshake(conn)
	cut := r.handshaken(p)
	if cut && err == nil {
		err = fmt.Errorf("%w: cut off in its handshake", ErrNotAuthenticated)
	}
	if err != nil {
		if !r.stopping.Load() && !cut {
			r.c.rejects.Rejected(from, "data plane of "+r.id.String(), "data-plane connection refused: "+err.Error())
		}
		return err
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return err
	}
	var opened []*inbox
	defer func() {
		if r.stopping.Load() {
			return
		}
		if errors.Is(err, ErrProtocol) {
			r.log.Warn("data-plane sender broke the protocol; its connection is closed", zap.String("from", from),
				zap.Stringer("attempt", r.id), zap.Error(err))
		}
		if len(opened) == 0 {
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
	mine := map[uint32]*inbox{} // the channels this connection opened
	for {
		kind, ch, p, _, err := readFrame(rd, MaxFrameSize)
		if err != nil {
			return err
		}
		switch kind {
		case frameOpen:
			b, err := r.open(ch)
			if err != nil {
				return err
			}
			mine[ch] = b
			opened = append(opened, b)
			b.setCredit(func() error { return credit(ch, 1) })
			if err := credit(ch, uint32(r.window)); err != nil {
				return err
			}
			continue
		case FrameData, FrameBarrier, FrameEOS:
		default:
			return fmt.Errorf("%w: frame of kind %d on channel %d", ErrProtocol, kind, ch)
		}
		b := mine[ch]
		if b == nil {
			return fmt.Errorf("%w: frame on channel %d, which this sender did not open", ErrProtocol, ch)
		}
		select {
		case b.frames <- Frame{Kind: kind, Payload: p}:
		default:
			return fmt.Errorf("%w: channel %d sent beyond its credit", ErrProtocol, ch)
		}
	}
}

// handshake runs the receiver's side of the handshake on conn (over TLS
// if configured): the sender's nonce, the receiver's, the sender's proof
// of this attempt's secret, then the receiver's own proof.
func (r *Receiver) handshake(conn net.Conn) (net.Conn, *bufio.Reader, *bufio.Writer, error) {
	if r.c.tlsCert != nil {
		tc := tls.Server(conn, &tls.Config{Certificates: []tls.Certificate{*r.c.tlsCert}, MinVersion: tls.VersionTLS13})
		if err := tc.Handshake(); err != nil {
			return conn, nil, nil, fmt.Errorf("%w: TLS: %w", ErrNotAuthenticated, err)
		}
		conn = tc // Serve's stop closes the TCP connection under it
	}
	binding, err := tlsBinding(conn)
	if err != nil {
		return conn, nil, nil, err
	}
	rd, w := bufio.NewReader(conn), bufio.NewWriter(conn)
	kind, _, nonceS, _, err := readFrame(rd, maxHandshakeFrame)
	switch {
	case err != nil:
		return conn, nil, nil, fmt.Errorf("%w: %w", ErrNotAuthenticated, err)
	case kind != frameBegin || len(nonceS) != nonceLen:
		return conn, nil, nil, fmt.Errorf("%w: %w: first frame of kind %d (%d bytes), want the sender's nonce", ErrNotAuthenticated, ErrWrongAttempt, kind, len(nonceS))
	}
	nonceR := make([]byte, nonceLen)
	_, _ = rand.Read(nonceR)
	if err := writeFrame(w, frameChallenge, 0, nonceLen, nonceR); err != nil {
		return conn, nil, nil, err
	}
	kind, _, p, _, err := readFrame(rd, maxHandshakeFrame)
	const fixed = 4 + macLen
	switch {
	case err != nil:
		return conn, nil, nil, fmt.Errorf("%w: %w", ErrNotAuthenticated, err)
	case kind != frameHello || len(p) < fixed:
		return conn, nil, nil, fmt.Errorf("%w: %w: frame of kind %d (%d bytes), want the sender's proof", ErrNotAuthenticated, ErrWrongAttempt, kind, len(p))
	}
	got := AttemptID{Job: string(p[fixed:]), Attempt: int32(binary.BigEndian.Uint32(p[:4]))}
	mac := p[4:fixed]
	if got != r.id {
		return conn, nil, nil, fmt.Errorf("%w: sender of %s, receiver of %s", ErrWrongAttempt, got, r.id)
	}
	if !hmac.Equal(mac, handshakeMAC(r.secret, "sender", r.id, nonceR, nonceS, binding)) {
		return conn, nil, nil, fmt.Errorf("%w: wrong proof for %s", ErrNotAuthenticated, r.id)
	}
	welcome := handshakeMAC(r.secret, "receiver", r.id, nonceR, nonceS, binding)
	if err := writeFrame(w, frameWelcome, 0, uint32(len(welcome)), welcome); err != nil {
		return conn, nil, nil, err
	}
	return conn, rd, w, nil
}

// Recv returns the next frame of channel ch, returning its credit. Once the
// channel's connection broke and its buffered frames were taken, it
// returns an error wrapping ErrConnectionLost; for a channel never
// declared (Expect), one wrapping ErrUndeclaredChannel.
func (r *Receiver) Recv(ctx context.Context, ch uint32) (Frame, error) {
	b := r.inbox(ch)
	if b == nil {
		return Frame{}, fmt.Errorf("%w: channel %d", ErrUndeclaredChannel, ch)
	}
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
