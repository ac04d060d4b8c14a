package taskmanager

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/runtime"
)

// Exchange is a runtime.Exchange over the data plane, for one deployment
// (one attempt's tasks on this task manager): it receives on its own
// Receiver, served on an ephemeral listener of its own so that channel
// numbers never meet those of another job or attempt, and sends to the
// Exchanges of the other task managers of the attempt, dialled at the first
// message by the data address of the task they run.
type Exchange struct {
	id     AttemptID
	secret []byte
	opts   []DataOpt
	recv   *Receiver
	lis    net.Listener
	addr   string // advertised
	cancel context.CancelFunc
	served chan error
	sent   atomic.Int64

	closeOnce sync.Once
	closeErr  error

	mu      sync.Mutex
	addrs   map[checkpoint.TaskID]string
	senders map[string]*Sender
	opened  map[uint32]bool
}

// ListenExchange starts an Exchange of attempt id receiving on host:0 (a
// port of ListenPorts if given) with window credits per channel. Addr is
// what the other task managers dial (on AdvertiseHost if given);
// SetPeers tells it where every task of the attempt runs. It sends and
// receives only within attempt id, with the attempt's secret (the job
// manager's, the same on every task manager of the attempt): a connection
// from a sender of another attempt, or of no attempt, is refused, and it
// receives only on the channels the deployment declares (DeclareInputs).
func ListenExchange(ctx context.Context, host string, window int, id AttemptID, secret []byte, opts ...DataOpt) (*Exchange, error) {
	rcv, err := NewReceiver(window, id, secret, opts...)
	if err != nil {
		return nil, err
	}
	var c dataCfg
	for _, o := range opts {
		o.apply(&c)
	}
	lis, err := listenData(host, c.ports)
	if err != nil {
		return nil, err
	}
	addr := lis.Addr().String()
	if c.advertise != "" {
		_, port, _ := net.SplitHostPort(addr)
		addr = net.JoinHostPort(c.advertise, port)
	}
	ctx, cancel := context.WithCancel(ctx)
	x := &Exchange{id: id, secret: slices.Clone(secret), opts: opts, recv: rcv, lis: lis, addr: addr, cancel: cancel, served: make(chan error, 1),
		senders: map[string]*Sender{}, opened: map[uint32]bool{}}
	go func() { x.served <- x.recv.Serve(ctx, lis) }()
	return x, nil
}

// ErrNoDataPort is wrapped when every port of ListenPorts is taken.
var ErrNoDataPort = errors.New("no free data-plane port")

// listenData listens on host at a free port: any (ports zero) or the first
// free one of ports[0]..ports[1].
func listenData(host string, ports [2]int) (net.Listener, error) {
	if ports == [2]int{} {
		lis, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("data plane listen: %w", err)
		}
		return lis, nil
	}
	var last error
	for p := ports[0]; p <= ports[1]; p++ {
		lis, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err == nil {
			return lis, nil
		}
		last = err
	}
	return nil, fmt.Errorf("%w in %d-%d on %s (last: %w)", ErrNoDataPort, ports[0], ports[1], host, last)
}

// Addr is the address the other task managers dial to reach the Exchange:
// where it listens, on AdvertiseHost if given.
func (x *Exchange) Addr() string { return x.addr }

var _ runtime.InputDeclarer = (*Exchange)(nil)

// DeclareInputs implements runtime.InputDeclarer: the Exchange receives
// on these channels only, each from one sender.
func (x *Exchange) DeclareInputs(from map[uint32]checkpoint.TaskID) {
	for ch := range from {
		x.recv.Expect(ch)
	}
}

// SetPeers sets the data address of every task of the attempt.
func (x *Exchange) SetPeers(addrs map[checkpoint.TaskID]string) {
	x.mu.Lock()
	x.addrs = addrs
	x.mu.Unlock()
}

// errUnknownTask is returned by Send for a task SetPeers did not name.
var errUnknownTask = errors.New("no data address for task")

func (x *Exchange) sender(ctx context.Context, to checkpoint.TaskID, ch uint32) (*Sender, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	addr, ok := x.addrs[to]
	if !ok {
		return nil, fmt.Errorf("%w %s", errUnknownTask, to)
	}
	s := x.senders[addr]
	if s == nil {
		var err error
		if s, err = DialData(ctx, addr, x.id, x.secret, x.opts...); err != nil {
			return nil, err
		}
		x.senders[addr] = s
	}
	if !x.opened[ch] {
		if err := s.Open(ch); err != nil {
			return nil, err
		}
		x.opened[ch] = true
	}
	return s, nil
}

// Send implements runtime.Exchange: it blocks while channel ch has no
// credit.
func (x *Exchange) Send(ctx context.Context, to checkpoint.TaskID, ch uint32, msg []byte) error {
	s, err := x.sender(ctx, to, ch)
	if err != nil {
		return err
	}
	if err := s.Send(ctx, ch, Frame{Kind: FrameData, Payload: msg}); err != nil {
		return err
	}
	x.sent.Add(1)
	return nil
}

// Sent counts the messages sent (batches, barriers, ends of stream).
func (x *Exchange) Sent() int64 { return x.sent.Load() }

// Recv implements runtime.Exchange.
func (x *Exchange) Recv(ctx context.Context, ch uint32) ([]byte, error) {
	f, err := x.recv.Recv(ctx, ch)
	return f.Payload, err
}

// Close closes the connections to the other task managers and stops
// receiving. Later calls return nil.
func (x *Exchange) Close() error {
	x.closeOnce.Do(func() {
		x.mu.Lock()
		var errs []error
		for _, s := range x.senders {
			if err := s.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
				errs = append(errs, err)
			}
		}
		x.senders = map[string]*Sender{}
		x.mu.Unlock()
		x.cancel()
		x.closeErr = errors.Join(append(errs, <-x.served)...)
	})
	return x.closeErr
}

// Deploy runs this task manager's share of an attempt (spec.Tasks),
// exchanging records with the attempt's other task managers through x. The
// returned deployment owns x: its Wait closes x once every task ended.
func Deploy(ctx context.Context, job *runtime.Job, spec runtime.DeploySpec, x *Exchange, rep runtime.TaskReports) (runtime.Deployed, error) {
	d, err := runtime.Deploy(ctx, job, spec, x, rep)
	if err != nil {
		_ = x.Close()
		return nil, err
	}
	st, _ := d.(statsReader)
	return &exchangeDeployment{Deployed: d, x: x, stats: st}, nil
}

// statsReader is what a task manager reads of a deployment for its
// heartbeats and its /metrics (runtime's local deployments have it).
type statsReader interface {
	TaskStats() []runtime.TaskStats
	OperatorMetrics() []runtime.OperatorMetric
}

type exchangeDeployment struct {
	runtime.Deployed
	x     *Exchange
	stats statsReader // nil if the deployment has none
}

// TaskStats implements statsReader.
func (d *exchangeDeployment) TaskStats() []runtime.TaskStats {
	if d.stats == nil {
		return nil
	}
	return d.stats.TaskStats()
}

// NoteCompleted implements completedNoter.
func (d *exchangeDeployment) NoteCompleted(id checkpoint.ID) {
	if n, ok := d.Deployed.(completedNoter); ok {
		n.NoteCompleted(id)
	}
}

// OperatorMetrics implements statsReader.
func (d *exchangeDeployment) OperatorMetrics() []runtime.OperatorMetric {
	if d.stats == nil {
		return nil
	}
	return d.stats.OperatorMetrics()
}

func (d *exchangeDeployment) Wait() bool {
	finished := d.Deployed.Wait()
	_ = d.x.Close() // every task ended: nothing in flight matters any more
	return finished
}
