package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// memExchange is an Exchange inside one process: a bounded queue per
// channel, as a data plane's credit window would be.
type memExchange struct {
	mu    sync.Mutex
	chans map[uint32]chan []byte
	sent  *atomic.Int64 // messages sent, across attempts
}

func (m *memExchange) ch(id uint32) chan []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.chans == nil {
		m.chans = map[uint32]chan []byte{}
	}
	c, ok := m.chans[id]
	if !ok {
		c = make(chan []byte, 4)
		m.chans[id] = c
	}
	return c
}

func (m *memExchange) Send(ctx context.Context, _ checkpoint.TaskID, id uint32, msg []byte) error {
	select {
	case m.ch(id) <- append([]byte(nil), msg...):
		m.sent.Add(1)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *memExchange) Recv(ctx context.Context, id uint32) ([]byte, error) {
	select {
	case msg := <-m.ch(id):
		return msg, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// splitDeployer deploys an attempt as parts deployments, task i of slot s
// in part s%parts, every record between parts encoded through one
// memExchange: a cluster of task managers without the network.
type splitDeployer struct {
	job   *Job
	parts int
	sent  *atomic.Int64
	// mems, if set, is each part's state memory (a task manager's).
	mems []*StateMemory
}

func (s splitDeployer) Deploy(ctx context.Context, spec DeploySpec, rep TaskReports) (Deployed, error) {
	shares, _, err := SlotShares(s.job, s.parts)
	if err != nil {
		return nil, err
	}
	ex := &memExchange{sent: s.sent}
	var parts []Deployed
	for _, share := range shares {
		ps := spec
		ps.Tasks = share
		if s.mems != nil {
			ps.StateMemory = s.mems[len(parts)]
		}
		d, err := Deploy(ctx, s.job, ps, ex, rep)
		if err != nil {
			for _, p := range parts {
				p.Cancel(false)
				p.Wait()
			}
			return nil, err
		}
		parts = append(parts, d)
	}
	return Combine(parts...), nil
}

func TestSlotSharesDealSlotsRoundRobinAndEveryTaskOnce(t *testing.T) {
	j := NewJob("shares", DefaultParallelism(3))
	recs := FromSource(j, "source", seqSourceOf(seqSource{keys: 2, splits: 2, n: 10, perPoll: 1}), Parallelism(2))
	SinkTo(Rebalance(recs), "sink", func() Sink[seqRec] { return discardSink[seqRec]{} }, Parallelism(5))
	for _, tc := range []struct {
		n    int
		want [][]checkpoint.TaskID
	}{
		{1, [][]checkpoint.TaskID{{"source#0", "source#1", "sink#0", "sink#1", "sink#2", "sink#3", "sink#4"}}},
		{2, [][]checkpoint.TaskID{{"source#0", "sink#0", "sink#2", "sink#4"}, {"source#1", "sink#1", "sink#3"}}},
		{3, [][]checkpoint.TaskID{{"source#0", "sink#0", "sink#3"}, {"source#1", "sink#1", "sink#4"}, {"sink#2"}}},
	} {
		shares, slots, err := SlotShares(j, tc.n)
		if err != nil {
			t.Fatal(err)
		}
		if slots != 5 {
			t.Errorf("n=%d: %d slots, want 5 (the largest parallelism)", tc.n, slots)
		}
		if !reflect.DeepEqual(shares, tc.want) {
			t.Errorf("n=%d: shares %v, want %v", tc.n, shares, tc.want)
		}
	}
	if _, _, err := SlotShares(j, 0); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("0 shares: %v, want ErrInvalidOption", err)
	}
}

func TestSplitDeploymentIsExactlyOnceUnderRandomFailures(t *testing.T) {
	for seed := int64(1); seed <= 12; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			var sent atomic.Int64
			runUnderRandomFailures(t, seed, 2, func(job *Job) []ClusterOpt {
				return []ClusterOpt{Deployment(splitDeployer{job: job, parts: 2, sent: &sent})}
			})
			if sent.Load() == 0 {
				t.Fatal("no message crossed between the two deployments")
			}
		})
	}
}

func TestRemoteEdgeOfAnUnencodableTypeIsRefused(t *testing.T) {
	j := NewJob("chan", DefaultParallelism(2))
	recs := FromSource(j, "source", seqSourceOf(seqSource{keys: 2, splits: 2, n: 10, perPoll: 1}))
	chans := Map(recs, "to-chan", func(seqRec) (chan int, error) { return nil, nil })
	SinkTo(Rebalance(chans), "sink", func() Sink[chan int] { return discardSink[chan int]{} })
	_, err := NewMiniCluster(Restarts(0, 0), Deployment(splitDeployer{job: j, parts: 2, sent: new(atomic.Int64)})).Run(t.Context(), j)
	if !errors.Is(err, ErrRemoteEdge) {
		t.Fatalf("err = %v, want ErrRemoteEdge", err)
	}
}

type discardSink[T any] struct{}

func (discardSink[T]) Open(context.Context, *OperatorContext) error { return nil }
func (discardSink[T]) Write(context.Context, T) error               { return nil }
func (discardSink[T]) Snapshot(context.Context, checkpoint.ID) (OperatorState, error) {
	return OperatorState{}, nil
}
func (discardSink[T]) Close() error { return nil }

// touchyRec is a seqRec on the wire whose JSON decoding panics when Poison
// is set: a user codec with a bug that one record triggers.
type touchyRec struct {
	Key    string
	Seq    int64
	Poison bool
}

func (r *touchyRec) UnmarshalJSON(b []byte) error {
	type plain touchyRec
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	if p.Poison {
		panic(fmt.Sprintf("touchy decoder: record %s/%d", p.Key, p.Seq))
	}
	*r = touchyRec(p)
	return nil
}

// A codec that panics decoding a record received from another deployment
// (another task manager) is a task failure: the process lives on, the
// attempt fails with an error carrying the panic, and the job restarts and
// delivers every record once.
func TestDecoderPanicOnTheDataPlaneIsATaskFailure(t *testing.T) {
	const keys, n = 8, 60
	var poisoned atomic.Bool // the first attempt's k003/30 only
	txns := newMemTxns()
	j := NewJob("touchy", DefaultParallelism(2))
	recs := FromSource(j, "source", seqSourceOf(seqSource{keys: keys, splits: 2, n: n, perPoll: 1}))
	marked := Map(recs, "mark", func(r seqRec) (touchyRec, error) {
		poison := r.Key == "k003" && r.Seq == 30 && poisoned.CompareAndSwap(false, true)
		return touchyRec{Key: r.Key, Seq: r.Seq, Poison: poison}, nil
	})
	unmarked := Process(KeyBy(marked, func(r touchyRec) string { return r.Key }, nil), "unmark",
		func() KeyedProcessFunction[string, touchyRec, seqRec] {
			return ProcessFunc[string, touchyRec, seqRec](func(_ string, r touchyRec, out Collector[seqRec]) error {
				out.Collect(seqRec{Key: r.Key, Seq: r.Seq})
				return nil
			})
		})
	SinkTo(unmarked, "sink", func() Sink[seqRec] { return &txnSink{txns: txns} })
	var failures []error
	sent := new(atomic.Int64)
	res, err := NewMiniCluster(CheckpointInterval(5*time.Millisecond), Restarts(2, time.Millisecond),
		OnRestart(func(_ int, err error) { failures = append(failures, err) }),
		Deployment(splitDeployer{job: j, parts: 2, sent: sent})).Run(t.Context(), j)
	if err != nil {
		t.Fatalf("job failed: %v (failures before: %v)", err, failures)
	}
	if !poisoned.Load() {
		t.Fatal("the poisoned record was never produced")
	}
	if res.Restarts != 1 || len(failures) != 1 {
		t.Fatalf("%d restarts (failures %v), want 1: the decoder's panic", res.Restarts, failures)
	}
	var pe *panicError
	if !errors.As(failures[0], &pe) || !strings.Contains(failures[0].Error(), "touchy decoder: record k003/30") ||
		!strings.Contains(failures[0].Error(), "receive") {
		t.Fatalf("attempt failed with %v; want the receiving side's error carrying the decoder's panic", failures[0])
	}
	checkSequences(t, txns.output(), keys, n)
}
