package runtime

import (
	"context"

	"github.com/weirstream/weir/checkpoint"
)

// envelope is what travels on a channel between two subtasks: a batch of
// records, a checkpoint barrier, or the end of the stream.
type envelope struct {
	batch   any           // []T
	barrier checkpoint.ID // a barrier when non-zero
	eos     bool
}

// outputGate is the untyped face of a task's output writers.
type outputGate interface {
	// flush sends every buffered record.
	flush(ctx context.Context) error
	// event flushes, then sends e on every channel.
	event(ctx context.Context, e envelope) error
}

// taskWiring is what output writers of one task share.
type taskWiring struct {
	ctx       context.Context
	batchSize int
	maxPar    int
}

// outWriter buffers records per downstream channel and sends them in batches:
// a channel's batch goes out when full, and every batch goes out when the
// task runs out of input or before a barrier. Channels are bounded, so a slow
// consumer blocks the writer: that is backpressure.
type outWriter[T any] struct {
	ctx   context.Context
	chans []chan envelope
	bufs  [][]T
	size  int
	route func(T) int
	next  int // round robin position
	kind  edgeKind
	par   int // parallelism of the downstream vertex
}

func newOutWriter[T any](tw *taskWiring, chans []chan envelope, e *edge, subtask int) *outWriter[T] {
	w := &outWriter[T]{ctx: tw.ctx, chans: chans, bufs: make([][]T, len(chans)), size: tw.batchSize, kind: e.kind,
		par: len(chans), next: subtask % len(chans)}
	for i := range w.bufs {
		w.bufs[i] = make([]T, 0, w.size)
	}
	switch e.kind {
	case edgeHash:
		kg := e.keyGroup.(func(T) int)
		maxPar := tw.maxPar
		w.route = func(v T) int { return SubtaskOf(kg(v), maxPar, w.par) }
	case edgeRebalance:
		w.route = func(T) int {
			w.next++
			if w.next == w.par {
				w.next = 0
			}
			return w.next
		}
	default: // forward: one channel; broadcast handled in push
		w.route = func(T) int { return 0 }
	}
	return w
}

func (w *outWriter[T]) push(v T) error {
	if w.kind == edgeBroadcast {
		for i := range w.bufs {
			if err := w.add(i, v); err != nil {
				return err
			}
		}
		return nil
	}
	return w.add(w.route(v), v)
}

func (w *outWriter[T]) add(i int, v T) error {
	w.bufs[i] = append(w.bufs[i], v)
	if len(w.bufs[i]) >= w.size {
		return w.send(w.ctx, i)
	}
	return nil
}

func (w *outWriter[T]) send(ctx context.Context, i int) error {
	select {
	case w.chans[i] <- envelope{batch: w.bufs[i]}:
		w.bufs[i] = make([]T, 0, w.size)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w *outWriter[T]) flush(ctx context.Context) error {
	for i := range w.bufs {
		if len(w.bufs[i]) > 0 {
			if err := w.send(ctx, i); err != nil {
				return err
			}
		}
	}
	return nil
}

func (w *outWriter[T]) event(ctx context.Context, e envelope) error {
	if err := w.flush(ctx); err != nil {
		return err
	}
	for _, ch := range w.chans {
		select {
		case ch <- e:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
