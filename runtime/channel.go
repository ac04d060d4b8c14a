package runtime

import (
	"context"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// envelope is what travels on a channel between two subtasks: a batch of
// records, a checkpoint barrier, a watermark or a status (idle, active), or
// the end of the stream. All travel in band, in order: a watermark behind a
// barrier on a channel blocked for alignment is delivered after it.
type envelope struct {
	batch   batcher       // a *batch[T]
	barrier checkpoint.ID // a barrier when non-zero
	eos     bool
	mark    markKind // a watermark (wm) or status when non-zero
	wm      int64
}

// batcher is the untyped face of a *batch[T].
type batcher interface {
	// release hands the batch back to the writer that filled it, for
	// reuse. The receiver calls it once it is done with the batch, and
	// must not touch the batch after.
	release()
}

// batch is a run of records on one channel. An output writer keeps a free
// list per channel; the receiver (a task delivering the batch, or the
// Exchange's send pump once it encoded it) releases the batch into it, and
// the writer refills it: a channel's batches are allocated once, not per
// send. The free list is a channel, so the receiver's last read of a batch
// happens before the writer's next write to it.
type batch[T any] struct {
	vs []T
	// kgs are the records' key groups on a hash edge (kgs[i] is vs[i]'s),
	// so that the keyed receiver does not hash the key again; nil on other
	// edges and on batches decoded from an Exchange.
	kgs []int32
	// ts are the records' event timestamps (ts[i] is vs[i]'s), NoTimestamp
	// for a record without one; empty while no record of the batch has
	// one, so that a job without event time neither writes nor reads a
	// timestamp per record (timestamp reads them).
	ts   []int64
	free chan *batch[T] // nil: not recycled
}

// timestamp returns the timestamp of record i.
func (b *batch[T]) timestamp(i int) int64 {
	if len(b.ts) == 0 {
		return NoTimestamp
	}
	return b.ts[i]
}

// stamp records ts as the timestamp of the record just appended to b.
func (b *batch[T]) stamp(ts int64) {
	if ts == NoTimestamp && len(b.ts) == 0 {
		return
	}
	b.stampSlow(ts)
}

// stampSlow is stamp once a record of the batch has a timestamp: the
// records before it without one get NoTimestamp.
func (b *batch[T]) stampSlow(ts int64) {
	for len(b.ts) < len(b.vs)-1 {
		b.ts = append(b.ts, NoTimestamp)
	}
	b.ts = append(b.ts, ts)
}

func (b *batch[T]) release() {
	if b.free == nil {
		return
	}
	select {
	case b.free <- b:
	default: // the list is full: let the collector have it
	}
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
	stats     *taskStats  // the task's counters
	now       *recordTime // the task's current record timestamp
}

// outWriter buffers records per downstream channel and sends them in batches:
// a channel's batch goes out when full, and every batch goes out when the
// task runs out of input or before a barrier. Channels are bounded, so a slow
// consumer blocks the writer: that is backpressure.
type outWriter[T any] struct {
	ctx      context.Context
	chans    []chan envelope
	bufs     []*batch[T]      // the batch being filled, per channel
	free     []chan *batch[T] // released batches, per channel
	size     int
	keyGroup func(T) int // hash edges
	// owner is the channel of each key group on a hash edge
	// (SubtaskOf, without a division per record).
	owner  []int32
	maxPar int
	route  func(T) int
	next   int // round robin position
	kind   edgeKind
	par    int // parallelism of the downstream vertex
	stats  *taskStats
	now    *recordTime // the timestamp of the record being pushed
	// pushed counts records pushed since the last batch went out; they are
	// added to stats.out when one does (one atomic add per batch).
	pushed int64
}

func newOutWriter[T any](tw *taskWiring, chans []chan envelope, e *edge, subtask int) *outWriter[T] {
	w := &outWriter[T]{ctx: tw.ctx, chans: chans, bufs: make([]*batch[T], len(chans)), free: make([]chan *batch[T], len(chans)),
		size: tw.batchSize, maxPar: tw.maxPar, kind: e.kind, par: len(chans), next: subtask % len(chans), stats: tw.stats, now: tw.now}
	if w.now == nil {
		w.now = &recordTime{ts: NoTimestamp}
	}
	for i, ch := range chans {
		// In flight at most: the channel's capacity, one being delivered,
		// one being filled.
		w.free[i] = make(chan *batch[T], cap(ch)+2)
		w.bufs[i] = w.newBatch(i)
	}
	switch e.kind {
	case edgeHash:
		w.keyGroup = e.keyGroup.(func(T) int)
		w.owner = make([]int32, w.maxPar)
		for kg := range w.owner {
			w.owner[kg] = int32(SubtaskOf(kg, w.maxPar, w.par))
		}
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

func (w *outWriter[T]) newBatch(i int) *batch[T] {
	b := &batch[T]{vs: make([]T, 0, w.size), free: w.free[i]}
	if w.kind == edgeHash {
		b.kgs = make([]int32, 0, w.size)
	}
	return b
}

func (w *outWriter[T]) push(v T) error {
	w.pushed++
	switch w.kind {
	case edgeHash:
		kg := w.keyGroup(v)
		i := w.owner[kg]
		b := w.bufs[i]
		b.vs, b.kgs = append(b.vs, v), append(b.kgs, int32(kg))
		b.stamp(w.now.ts)
		if len(b.vs) >= w.size {
			return w.send(w.ctx, int(i))
		}
		return nil
	case edgeBroadcast:
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
	b := w.bufs[i]
	b.vs = append(b.vs, v)
	b.stamp(w.now.ts)
	if len(b.vs) >= w.size {
		return w.send(w.ctx, i)
	}
	return nil
}

func (w *outWriter[T]) send(ctx context.Context, i int) error {
	if err := w.stats.put(ctx, w.chans[i], envelope{batch: w.bufs[i]}); err != nil {
		return err
	}
	select {
	case b := <-w.free[i]:
		b.vs, b.kgs, b.ts = b.vs[:0], b.kgs[:0], b.ts[:0]
		w.bufs[i] = b
	default:
		w.bufs[i] = w.newBatch(i)
	}
	w.stats.out.Add(w.pushed)
	w.pushed = 0
	return nil
}

func (w *outWriter[T]) flush(ctx context.Context) error {
	for i := range w.bufs {
		if len(w.bufs[i].vs) > 0 {
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
