package kafkatxn

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/failpoint"
)

// Errors of a TxnWriter, matchable with errors.Is.
var (
	// ErrTxnLost is wrapped by Recover errors for pre-committed
	// transactions of a completed checkpoint that can no longer be
	// committed (timed out or aborted at the broker): their records are
	// lost. Callers fail the job unless the user opted out.
	ErrTxnLost = errors.New("pre-committed transaction lost")
	// ErrPoolExhausted is returned by Write when every transactional id of
	// the subtask's pool is open, pre-committed, or still named by the
	// latest completed checkpoint, and by PreCommit (also wrapping
	// checkpoint.ErrDeclined) when all but one id await their commit:
	// notifications lag too far behind. The job restarts from its latest
	// completed checkpoint, which always leaves an id free.
	ErrPoolExhausted = errors.New("transactional id pool exhausted")
	// ErrNotRecovered is returned by Write and PreCommit of an exactly-once
	// writer before Recover succeeded.
	ErrNotRecovered = errors.New("Recover must be called before writing")
	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("writer closed")
)

// LostTxnError describes one transaction Recover could not commit. It
// matches ErrTxnLost with errors.Is.
type LostTxnError struct {
	Handle checkpoint.TxnHandle
	Err    error // the broker's answer, e.g. kerr.InvalidTxnState
}

func (e *LostTxnError) Error() string {
	return fmt.Sprintf("transaction %s (producer %d, epoch %d) of checkpoint %d lost: %v",
		e.Handle.TransactionalID, e.Handle.ProducerID, e.Handle.Epoch, e.Handle.Checkpoint, e.Err)
}

// Unwrap returns ErrTxnLost and the broker error.
func (e *LostTxnError) Unwrap() []error { return []error{ErrTxnLost, e.Err} }

type slotState uint8

const (
	slotFree slotState = iota
	slotOpen
	slotPrecommitted
	// slotCommitted: committed, but its handle may still be named by the
	// latest completed checkpoint, so a restore may try to commit it again.
	// Reusing the id now would start a transaction at the next epoch, and
	// that repeated commit would answer PRODUCER_FENCED, indistinguishable
	// from a real loss. The slot is freed once a checkpoint taken after the
	// commit completes (lastSnap < the notified id).
	slotCommitted
)

// syncClient brings the slot's kgo client up to date after its transaction
// was ended with a raw EndTxn: it repeats the same end through kgo, which
// the broker answers as a retry (success, with the bumped epoch, under
// KIP-890). If kgo did not end up at a newer epoch than the handle's (it
// skipped the request, or took its "nothing produced" abort path, which the
// broker refuses), the client is closed and the next transaction on the id
// gets a fresh one (InitProducerID).
func (w *TxnWriter) syncClient(ctx context.Context, s *slot, how kgo.TransactionEndTry) {
	if s.cl == nil {
		return
	}
	if err := s.cl.EndTransaction(ctx, how); err == nil {
		if pid, epoch, err := s.cl.ProducerID(ctx); err == nil && (pid != s.handle.ProducerID || epoch > s.handle.Epoch) {
			return
		}
	}
	w.cfg.logger.Debug("kafkatxn: replacing producer after EndTxn", zap.String("txn", s.txnID))
	s.cl.Close()
	s.cl = nil
}

func (s slotState) String() string {
	return [...]string{"free", "open", "pre-committed", "committed"}[s]
}

// slot is one transactional id of the pool and its (lazily made) producer.
type slot struct {
	index    int
	txnID    string
	cl       *kgo.Client
	state    slotState
	records  int64                    // records written into the open transaction
	firsts   firstOffsets             // first offset per partition of the open transaction
	promise  func(*kgo.Record, error) // the produce promise of the slot's records, made once
	handle   checkpoint.TxnHandle     // valid when pre-committed or committed
	lastSnap checkpoint.ID            // last checkpoint whose snapshot names handle
}

// TxnWriter is the runtime-independent core of the Kafka sink for one sink
// subtask: a two-phase-commit writer with one Kafka transaction per
// checkpoint epoch.
//
// Life cycle (exactly-once):
//
//	w, _ := NewTxnWriter(ctx, opts...)
//	w.Recover(ctx, handlesOfRestoredCheckpoint) // nil on a fresh start
//	for each record:      w.Write(ctx, r)
//	on barrier n:         w.PreCommit(ctx, n); snapshot w.Pending()
//	on notify complete n: w.Commit(ctx, n)
//	on notify aborted n:  w.Abort(ctx, n)
//	w.Close()
//
// Transactional ids are "<prefix>-<subtask>-<poolIndex>", a bounded pool
// per subtask. A transaction is begun lazily on the first Write of an epoch
// and stays open after pre-commit until Commit or Abort. Notifications are
// best effort: Commit(n) commits everything pre-committed up to n, and the
// snapshot of checkpoint n must name every transaction still pending at
// barrier n (Pending), so a restore from n finishes what a lost
// notification left open.
//
// A TxnWriter is safe for concurrent use, but operations are serialised;
// failpoint hooks run under its lock and must not call back into it. With
// the SingleGoroutine option its owner makes every call that changes it
// (see there), and Write takes no lock while a transaction is open.
//
// A record written with a zero Timestamp is stamped with the writer's
// coarse clock (stampClock): time.Now read at most about once per
// millisecond while records flow, so a stamp may be up to about a
// millisecond (plus scheduling delay) earlier than the Write.
type TxnWriter struct {
	cfg      cfg
	admin    *kgo.Client              // raw transaction requests; the producer when not exactly-once
	produced func(*kgo.Record, error) // w.onProduced, made once (a method value allocates)
	clock    stampClock               // under mu, or the owner's (SingleGoroutine)

	asyncErr   atomic.Pointer[error] // first asynchronous produce error
	lostTxns   atomic.Int64          // transactions the broker could no longer commit
	unverified atomic.Int64          // restored transactions assumed committed (Recover)

	mu            sync.Mutex
	slots         []*slot
	cur           *slot   // open transaction, nil between epochs
	pending       []*slot // pre-committed, in checkpoint order
	lastPrecommit checkpoint.ID
	recovered     bool
	restoreDone   map[txnKey]bool // handles committed (or found lost) on restore
	closed        bool
	failed        error // sticky: the writer's transactions are in an unknown state
}

// NewTxnWriter validates the options and connects to the cluster. An
// exactly-once writer makes no producer and touches no transaction until
// Recover.
func NewTxnWriter(ctx context.Context, opts ...Opt) (*TxnWriter, error) {
	c := defaultCfg()
	for _, o := range opts {
		o.apply(&c)
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	copts := append(append([]kgo.Opt(nil), c.clientOpts...), kgo.SeedBrokers(c.brokers...))
	admin, err := kgo.NewClient(copts...)
	if err != nil {
		return nil, fmt.Errorf("%w: kafka client: %w", ErrInvalidConfig, err)
	}
	if err := admin.Ping(ctx); err != nil {
		admin.Close()
		return nil, fmt.Errorf("connect to %v: %w", c.brokers, err)
	}
	w := &TxnWriter{cfg: c, admin: admin}
	w.produced = w.onProduced
	if c.guarantee == ExactlyOnce {
		w.slots = make([]*slot, c.poolSize)
		for i := range w.slots {
			w.slots[i] = &slot{index: i, txnID: TransactionalID(c.prefix, c.subtask, i)}
		}
	} else {
		w.recovered = true // nothing to recover without transactions
	}
	// The caller's logger is scoped with the operator and subtask already.
	c.logger.Debug("transactional writer created",
		zap.Stringer("guarantee", c.guarantee), zap.String("prefix", c.prefix), zap.Int("pool", c.poolSize))
	return w, nil
}

// TransactionalID returns the transactional id of a pool index of a
// subtask: "<prefix>-<subtask>-<index>".
func TransactionalID(prefix string, subtask, index int) string {
	return prefix + "-" + strconv.Itoa(subtask) + "-" + strconv.Itoa(index)
}

// IsTransactionalIDOf reports whether txnID is one TransactionalID makes
// for prefix: "<prefix>-<subtask>-<index>", canonical decimals. The ids of
// a prefix that extends prefix ("a-b-0-0" for "a") are not.
func IsTransactionalIDOf(prefix, txnID string) bool {
	_, _, ok := parseTransactionalID(prefix, txnID)
	return ok
}

// LostTransactions counts the pre-committed transactions of completed
// checkpoints that the broker could no longer commit (timed out, aborted or
// fenced): each one lost records, and was logged at error level naming it.
// A metric exports it.
func (w *TxnWriter) LostTransactions() int64 { return w.lostTxns.Load() }

// Admin returns an admin client of the writer's brokers (owned by the
// writer: do not close it).
func (w *TxnWriter) Admin() *kadm.Client { return kadm.NewClient(w.admin) }

// Guarantee returns the writer's delivery guarantee.
func (w *TxnWriter) Guarantee() DeliveryGuarantee { return w.cfg.guarantee }

func (w *TxnWriter) onProduced(r *kgo.Record, err error) {
	if err == nil {
		return
	}
	err = fmt.Errorf("produce to %s[%d]: %w", r.Topic, r.Partition, err)
	w.asyncErr.CompareAndSwap(nil, &err)
}

func (w *TxnWriter) produceErr() error {
	if p := w.asyncErr.Load(); p != nil {
		return *p
	}
	return nil
}

// usable reports why the writer cannot take records, if it cannot.
func (w *TxnWriter) usable() error {
	switch {
	case w.closed:
		return ErrClosed
	case w.failed != nil:
		return w.failed
	case !w.recovered:
		return ErrNotRecovered
	}
	return w.produceErr()
}

func (w *TxnWriter) fail(err error) error {
	if w.failed == nil {
		w.failed = err
	}
	return err
}

// failEnd handles err of the EndTxn that was to end s's pending
// transaction: it fails the writer (counting and logging a lost commit),
// unless ctx ended and so cut the EndTxn short, which is no failure of the
// writer: the transaction stays pending and the next Commit or EndJob sends
// its EndTxn again (one that did reach the broker is answered as a retry).
func (w *TxnWriter) failEnd(ctx context.Context, s *slot, err error) error {
	if ctx.Err() != nil {
		return err
	}
	var le *LostTxnError
	if errors.As(err, &le) {
		w.lostTxns.Add(1)
		w.cfg.logger.Error("kafkatxn: pre-committed transaction of a completed checkpoint is LOST; its records are gone",
			zap.String("txn", s.txnID), zap.Uint64("checkpoint", uint64(s.handle.Checkpoint)), zap.Error(le.Err))
	}
	return w.fail(err)
}

// Current begins the epoch's transaction if none is open and returns its
// transactional id, producer id and epoch: what a record written into the
// transaction needs to name it (an ack marker, so that others can match and,
// if stale, abort it). Exactly once only.
func (w *TxnWriter) Current(ctx context.Context) (checkpoint.TxnHandle, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.usable(); err != nil {
		return checkpoint.TxnHandle{}, err
	}
	if w.cfg.guarantee != ExactlyOnce {
		return checkpoint.TxnHandle{}, fmt.Errorf("%w: no transaction without exactly-once", ErrInvalidConfig)
	}
	if w.cur == nil {
		s, err := w.begin(ctx)
		if err != nil {
			return checkpoint.TxnHandle{}, err
		}
		w.cur = s
	}
	pid, epoch, err := w.cur.cl.ProducerID(ctx)
	if err != nil {
		return checkpoint.TxnHandle{}, fmt.Errorf("producer id of %s: %w", w.cur.txnID, err)
	}
	return checkpoint.TxnHandle{TransactionalID: w.cur.txnID, ProducerID: pid, Epoch: epoch}, nil
}

// Write produces r asynchronously into the current transaction (exactly
// once) or directly. A produce failure is remembered and returned by later
// Write and PreCommit calls: the epoch can then only be rolled back. ctx
// bounds the wait for buffer space (backpressure), as in kgo. A zero
// Timestamp is set from the writer's coarse clock (see TxnWriter).
//
// With SingleGoroutine, a Write into an open transaction of a usable
// writer takes no lock: it reads state only the owner changes.
func (w *TxnWriter) Write(ctx context.Context, r *kgo.Record) error {
	if w.cfg.singleGoroutine && !w.closed && w.failed == nil && w.recovered && w.asyncErr.Load() == nil {
		if w.cfg.guarantee != ExactlyOnce {
			w.stamp(r)
			w.admin.Produce(ctx, r, w.produced)
			return nil
		}
		if s := w.cur; s != nil {
			w.stamp(r)
			s.records++
			s.cl.Produce(ctx, r, s.promise)
			return nil
		}
	}
	w.mu.Lock()
	err := w.writeLocked(ctx, r)
	w.mu.Unlock()
	return err
}

// writeLocked is Write under w.mu: it checks the writer and begins the
// epoch's transaction if none is open.
func (w *TxnWriter) writeLocked(ctx context.Context, r *kgo.Record) error {
	if err := w.usable(); err != nil {
		return err
	}
	if w.cfg.guarantee != ExactlyOnce {
		w.stamp(r)
		w.admin.Produce(ctx, r, w.produced)
		return nil
	}
	if w.cur == nil {
		s, err := w.begin(ctx)
		if err != nil {
			return err
		}
		w.cur = s
	}
	w.stamp(r)
	w.cur.records++
	w.cur.cl.Produce(ctx, r, w.cur.promise)
	return nil
}

// stamp sets a zero record timestamp from the coarse clock (kgo would call
// time.Now for every record).
func (w *TxnWriter) stamp(r *kgo.Record) {
	if r.Timestamp.IsZero() {
		r.Timestamp = w.clock.read()
	}
}

// promiseOf returns the produce promise of s's records: it notes the first
// offsets of a successful record and remembers a failure.
func (w *TxnWriter) promiseOf(s *slot) func(*kgo.Record, error) {
	return func(r *kgo.Record, err error) {
		if err == nil {
			s.firsts.note(r.Topic, r.Partition, r.Offset)
			return
		}
		w.onProduced(r, err)
	}
}

// firstOffsets collects the lowest offset of a transaction's records in
// each partition (what broker-lost-transaction recovery reads from), from
// produce results, which arrive on kgo's promise goroutine. It keeps one
// atomic minimum per partition: a partition already noted costs a lookup
// and one atomic load per record, as kgo finishes a partition's records in
// offset order; a lower offset (whatever the order) replaces it with a
// compare-and-swap. The tables grow under mu, copy on write.
type firstOffsets struct {
	topics atomic.Pointer[[]*topicFirsts]
	mu     sync.Mutex // serialises growth and take
}

// topicFirsts is the per-partition minimum of one topic; unseen marks a
// partition without a record.
type topicFirsts struct {
	topic string
	parts atomic.Pointer[[]*atomic.Int64] // by partition
}

const unseen = math.MaxInt64

func (f *firstOffsets) note(topic string, partition int32, offset int64) {
	p := f.lookup(topic, partition)
	for {
		cur := p.Load()
		if offset >= cur || p.CompareAndSwap(cur, offset) {
			return
		}
	}
}

// lookup returns the minimum of a partition, making it if it is new.
func (f *firstOffsets) lookup(topic string, partition int32) *atomic.Int64 {
	if ts := f.topics.Load(); ts != nil {
		for _, t := range *ts {
			if t.topic == topic {
				if ps := *t.parts.Load(); int(partition) < len(ps) {
					return ps[partition]
				}
				break
			}
		}
	}
	return f.grow(topic, partition)
}

func (f *firstOffsets) grow(topic string, partition int32) *atomic.Int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ts []*topicFirsts
	if p := f.topics.Load(); p != nil {
		ts = *p
	}
	i := slices.IndexFunc(ts, func(t *topicFirsts) bool { return t.topic == topic })
	if i < 0 {
		t := &topicFirsts{topic: topic}
		t.parts.Store(&[]*atomic.Int64{})
		ts = append(slices.Clip(ts), t) // readers may hold the old slice
		f.topics.Store(&ts)
		i = len(ts) - 1
	}
	t := ts[i]
	ps := *t.parts.Load()
	if int(partition) >= len(ps) {
		ps = slices.Clip(ps)
		for len(ps) <= int(partition) {
			m := new(atomic.Int64)
			m.Store(unseen)
			ps = append(ps, m)
		}
		t.parts.Store(&ps)
	}
	return ps[partition]
}

// take returns the partitions noted since the last take, sorted, and
// forgets them.
func (f *firstOffsets) take() []checkpoint.TxnPartition {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []checkpoint.TxnPartition
	if ts := f.topics.Load(); ts != nil {
		for _, t := range *ts {
			for p, m := range *t.parts.Load() {
				if o := m.Swap(unseen); o != unseen {
					out = append(out, checkpoint.TxnPartition{Topic: t.topic, Partition: int32(p), FirstOffset: o})
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b checkpoint.TxnPartition) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Partition) - int(b.Partition)
	})
	return out
}

// stampClock is a writer's clock for record timestamps: time.Now costs
// about 60 ns on a VM, as much as the rest of a Write. It reads time.Now
// at most once per clockPeriod while records flow: a timer marks the
// reading stale clockPeriod after it was taken, and the next read after
// that reads time.Now again and rearms the timer. An idle writer costs
// nothing (the timer fired once). So a stamp is never later than the
// Write, and earlier by at most clockPeriod plus the timer's scheduling
// delay. Not safe for concurrent use (the writer's lock or its owner).
type stampClock struct {
	now   time.Time
	stale atomic.Bool // set by the timer
	timer *time.Timer
}

// clockPeriod is how long a stampClock reading is used: Kafka timestamps
// have millisecond resolution.
const clockPeriod = time.Millisecond

func (c *stampClock) read() time.Time {
	switch {
	case c.timer == nil:
		c.now = time.Now()
		c.timer = time.AfterFunc(clockPeriod, func() { c.stale.Store(true) })
	case c.stale.Load():
		c.stale.Store(false)
		c.now = time.Now()
		c.timer.Reset(clockPeriod)
	}
	return c.now
}

func (c *stampClock) stop() {
	if c.timer != nil {
		c.timer.Stop()
	}
}

// Flush waits until every record written so far was acknowledged by the
// broker (into the open transaction, if exactly once), and returns the
// first produce error. It neither pre-commits nor commits.
func (w *TxnWriter) Flush(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	cl := w.admin
	if w.cfg.guarantee == ExactlyOnce {
		if w.cur == nil {
			return w.produceErr()
		}
		cl = w.cur.cl
	}
	if err := cl.Flush(ctx); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	return w.produceErr()
}

// begin takes the lowest free slot and begins a transaction on it.
func (w *TxnWriter) begin(ctx context.Context) (*slot, error) {
	var s *slot
	for _, c := range w.slots {
		if c.state == slotFree {
			s = c
			break
		}
	}
	if s == nil {
		return nil, fmt.Errorf("%w: %s", ErrPoolExhausted, w.poolSummary())
	}
	if s.cl == nil {
		// Client telemetry is off: a closing client would wait to push its
		// final metrics, and producers are replaced after failures.
		opts := append(append([]kgo.Opt(nil), w.cfg.clientOpts...),
			kgo.DisableClientMetrics(),
			kgo.SeedBrokers(w.cfg.brokers...),
			kgo.TransactionalID(s.txnID),
			kgo.TransactionTimeout(w.cfg.txnTimeout),
		)
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			return nil, w.fail(fmt.Errorf("%w: kafka producer %s: %w", ErrInvalidConfig, s.txnID, err))
		}
		// InitProducerID now, so that a bad transaction timeout or a
		// missing ACL fails this Write rather than a later flush.
		if _, _, err := cl.ProducerID(ctx); err != nil {
			cl.Close()
			return nil, fmt.Errorf("init producer %s: %w", s.txnID, err)
		}
		s.cl = cl
	}
	if err := s.cl.BeginTransaction(); err != nil {
		return nil, w.fail(fmt.Errorf("begin transaction on %s: %w", s.txnID, err))
	}
	s.state, s.records = slotOpen, 0
	s.firsts.take() // forget a previous transaction's partitions
	if s.promise == nil {
		s.promise = w.promiseOf(s)
	}
	return s, nil
}

func (w *TxnWriter) poolSummary() string {
	counts := make(map[slotState]int)
	for _, s := range w.slots {
		counts[s.state]++
	}
	return fmt.Sprintf("pool of %d: %d open, %d pre-committed, %d committed but still named by the latest checkpoint (notifications lag; raise PoolSize)",
		len(w.slots), counts[slotOpen], counts[slotPrecommitted], counts[slotCommitted])
}

// PreCommit ends epoch id at barrier id. Exactly once: it flushes the
// current transaction and, if it holds records, pre-commits it: it records
// its handle (transactional id, producer id and epoch, read right before
// pre-commit since the epoch bumps after every EndTxn), leaves it open, and
// the next Write begins the next transaction on another pool id. It returns
// ok=false for an epoch without records, which commits nothing. Then it
// fires failpoint sink.after-precommit.
//
// The handle alone is not the snapshot: store Pending() in checkpoint id,
// which also names earlier transactions whose commit notification has not
// arrived.
//
// At least once: PreCommit flushes and returns ok=false. None: it does
// nothing. ids must increase.
func (w *TxnWriter) PreCommit(ctx context.Context, id checkpoint.ID) (checkpoint.TxnHandle, bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.usable(); err != nil {
		return checkpoint.TxnHandle{}, false, err
	}
	if id <= w.lastPrecommit {
		return checkpoint.TxnHandle{}, false, fmt.Errorf("pre-commit of checkpoint %d after %d: ids must increase", id, w.lastPrecommit)
	}
	var (
		h  checkpoint.TxnHandle
		ok bool
	)
	switch {
	case w.cfg.guarantee == AtLeastOnce:
		if err := w.admin.Flush(ctx); err != nil {
			return h, false, fmt.Errorf("flush at checkpoint %d: %w", id, err)
		}
		if err := w.produceErr(); err != nil {
			return h, false, err
		}
	case w.cfg.guarantee == ExactlyOnce && w.cur != nil && w.cur.records > 0:
		s := w.cur
		// A snapshot may name at most len(slots)-1 of our ids, so that a
		// restore from it (which keeps the named ids out of the pool) leaves
		// an id to write with.
		if len(w.pending) >= len(w.slots)-1 {
			return h, false, fmt.Errorf("checkpoint %d: %w: %w: %d transactions already await their commit notification",
				id, checkpoint.ErrDeclined, ErrPoolExhausted, len(w.pending))
		}
		if err := s.cl.Flush(ctx); err != nil {
			return h, false, fmt.Errorf("flush %s at checkpoint %d: %w", s.txnID, id, err)
		}
		if err := w.produceErr(); err != nil {
			return h, false, err
		}
		pid, epoch, err := s.cl.ProducerID(ctx)
		if err != nil {
			return h, false, w.fail(fmt.Errorf("producer id of %s: %w", s.txnID, err))
		}
		h = checkpoint.TxnHandle{TransactionalID: s.txnID, ProducerID: pid, Epoch: epoch, Checkpoint: id, Partitions: s.firsts.take()}
		s.state, s.handle = slotPrecommitted, h
		w.pending = append(w.pending, s)
		w.cur, ok = nil, true
		w.cfg.logger.Debug("transaction pre-committed", zap.String("txn", s.txnID), zap.Int64("producer_id", pid),
			zap.Int16("epoch", epoch), zap.Uint64("checkpoint", uint64(id)), zap.Int64("records", s.records))
	}
	w.lastPrecommit = id
	for _, s := range w.pending {
		s.lastSnap = id // every pending transaction is named by snapshot id
	}
	if err := w.cfg.failpoints.InjectContext(ctx, failpoint.SinkAfterPrecommit); err != nil {
		return checkpoint.TxnHandle{}, false, err
	}
	return h, ok, nil
}

// Pending returns the handles of every pre-committed transaction not yet
// committed, in checkpoint order. After PreCommit(id) these are the handles
// to store in the snapshot of checkpoint id. Nil unless exactly-once.
func (w *TxnWriter) Pending() []checkpoint.TxnHandle {
	w.mu.Lock()
	defer w.mu.Unlock()
	var hs []checkpoint.TxnHandle
	for _, s := range w.pending {
		hs = append(hs, s.handle)
	}
	return hs
}

// Commit commits, in checkpoint order, every pre-committed transaction of a
// checkpoint <= upTo (EndTxn commit on its own producer), firing failpoint
// sink.after-commit after each EndTxn returned. It is idempotent, and a
// commit for n covers every checkpoint <= n. A failed EndTxn leaves the
// writer failed: restore from the latest completed checkpoint, whose
// Recover retries the commit. An EndTxn cut short because ctx ended is not
// a failure of the writer: its transaction stays pending, and the next
// Commit sends it again (a job cancelled during a notification commits in
// EndJob what the notification could not).
func (w *TxnWriter) Commit(ctx context.Context, upTo checkpoint.ID) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	if w.failed != nil {
		return w.failed
	}
	for len(w.pending) > 0 && w.pending[0].handle.Checkpoint <= upTo {
		s := w.pending[0]
		if err := w.endTxn(ctx, s.handle, true); err != nil {
			return w.failEnd(ctx, s, err)
		}
		w.syncClient(ctx, s, kgo.TryCommit)
		s.state = slotCommitted
		w.pending = w.pending[1:]
		w.cfg.logger.Debug("transaction committed", zap.String("txn", s.txnID), zap.Uint64("checkpoint", uint64(s.handle.Checkpoint)))
		if err := w.cfg.failpoints.InjectContext(ctx, failpoint.SinkAfterCommit); err != nil {
			return err
		}
	}
	// Checkpoint upTo completed: a restore now starts from upTo or later,
	// whose snapshots do not name transactions committed before they were
	// taken.
	for _, s := range w.slots {
		if s.state == slotCommitted && s.lastSnap < upTo {
			s.state = slotFree
		}
	}
	return nil
}

// Abort aborts the transactions pre-committed for checkpoint id and
// returns their ids to the pool. Use it only when checkpoint id can no
// longer complete (notifyCheckpointAborted).
func (w *TxnWriter) Abort(ctx context.Context, id checkpoint.ID) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	kept := w.pending[:0]
	var err error
	for _, s := range w.pending {
		if s.handle.Checkpoint != id || err != nil {
			kept = append(kept, s)
			continue
		}
		if e := w.endTxn(ctx, s.handle, false); e != nil {
			err = w.failEnd(ctx, s, e)
			kept = append(kept, s)
			continue
		}
		w.syncClient(ctx, s, kgo.TryAbort)
		s.state = slotFree
		w.cfg.logger.Info("aborted pre-committed transaction", zap.String("txn", s.txnID), zap.Uint64("checkpoint", uint64(id)))
	}
	w.pending = kept
	return err
}

// EndJob ends a job cancelled for good (checkpoint.CancelListener): it
// commits every transaction pre-committed for a checkpoint <= last (the
// latest completed one, whose notification may have been lost) and aborts
// every later pre-committed one, so nothing stays open to pin the last
// stable offset until the transaction timeout. Close then aborts the open
// one. Without exactly-once it does nothing.
func (w *TxnWriter) EndJob(ctx context.Context, last checkpoint.ID) error {
	if w.cfg.guarantee != ExactlyOnce {
		return nil
	}
	var errs []error
	if last > 0 {
		if err := w.Commit(ctx, last); err != nil {
			errs = append(errs, err)
		}
	}
	for _, h := range w.Pending() {
		if h.Checkpoint > last {
			if err := w.Abort(ctx, h.Checkpoint); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Close aborts the open (not yet pre-committed) transaction and closes
// every client. Pre-committed transactions are left open on purpose: their
// checkpoint may complete after all, and the next Recover commits them (if
// the restored checkpoint names them) or aborts them. A job that is
// cancelled for good calls EndJob first; otherwise its pre-committed
// transactions pin the last stable offset until the transaction timeout.
func (w *TxnWriter) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.closed = true
	w.clock.stop()
	if s := w.cur; s != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := s.cl.AbortBufferedRecords(ctx)
		var pid int64
		var epoch int16
		if err == nil {
			pid, epoch, err = s.cl.ProducerID(ctx)
		}
		if err == nil {
			err = w.endTxn(ctx, checkpoint.TxnHandle{TransactionalID: s.txnID, ProducerID: pid, Epoch: epoch}, false)
		}
		if err != nil {
			w.cfg.logger.Warn("kafkatxn: abort open transaction on close; it lingers until Recover or its timeout",
				zap.String("txn", s.txnID), zap.Error(err))
		}
		cancel()
	}
	w.closeClients()
}

func (w *TxnWriter) closeClients() {
	for _, s := range w.slots {
		if s.cl != nil {
			s.cl.Close()
			s.cl = nil
		}
	}
	w.admin.Close()
}
