package runtime

import (
	"context"
	"time"

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
	stats     *taskStats // the task's counters
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
	stats *taskStats
	// pushed counts records pushed since the last batch went out; they are
	// added to stats.out when one does (one atomic add per batch).
	pushed int64
}

func newOutWriter[T any](tw *taskWiring, chans []chan envelope, e *edge, subtask int) *outWriter[T] {
	w := &outWriter[T]{ctx: tw.ctx, chans: chans, bufs: make([][]T, len(chans)), size: tw.batchSize, kind: e.kind,
		par: len(chans), next: subtask % len(chans), stats: tw.stats}
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
	w.pushed++
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
	if err := w.stats.put(ctx, w.chans[i], envelope{batch: w.bufs[i]}); err != nil {
		return err
	}
	w.bufs[i] = make([]T, 0, w.size)
	w.stats.out.Add(w.pushed)
	w.pushed = 0
	return nil
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
		if err := w.stats.put(ctx, ch, e); err != nil {
			return err
		}
	}
	return nil
}

// put sends e on ch; the time it waits for room on a full channel (the
// consumer, or the Exchange's credits behind it, are slower) is
// back-pressure, added to the task's counter.
func (s *taskStats) put(ctx context.Context, ch chan<- envelope, e envelope) error {
	select {
	case ch <- e:
		return nil
	default:
	}
	start := time.Now()
	defer func() { s.backPressuredNs.Add(int64(time.Since(start))) }()
	select {
	case ch <- e:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
