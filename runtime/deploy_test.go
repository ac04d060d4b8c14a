package runtime

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"

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
