package runtime

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weirstream/weir/checkpoint"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func newRand(seed int64) *rand.Rand { return rand.New(rand.NewSource(seed)) }

// seqRec is one record of the sequence source: the seq-th record of key.
type seqRec struct {
	Key string
	Seq int64
}

// seqSource is a replayable in-memory source: keys are split into a fixed
// number of splits; each split emits its keys' sequence numbers 1..n in
// rounds. Its state is one entry per split it owns: the split and the
// number of rounds it emitted.
type seqSource struct {
	keys, splits, n, perPoll int
	stallAt                  int           // when > 0, emit nothing past this round (an endless, idle source)
	pollDelay                time.Duration // paces the source: a sleep per Poll
	owned                    map[int]int   // split -> rounds emitted
	order                    []int
	emitted                  *atomic.Int64
}

func (s *seqSource) Open(_ context.Context, oc *OperatorContext) error {
	s.owned = map[int]int{}
	if oc.RestoredFrom == 0 {
		for sp := oc.Subtask; sp < s.splits; sp += oc.Parallelism {
			s.owned[sp] = 0
		}
	}
	for _, e := range oc.Restored {
		if len(e) != 16 {
			return fmt.Errorf("bad split state %x", e)
		}
		s.owned[int(binary.BigEndian.Uint64(e))] = int(binary.BigEndian.Uint64(e[8:]))
	}
	s.order = s.order[:0]
	for sp := range s.owned {
		s.order = append(s.order, sp)
	}
	sort.Ints(s.order)
	return nil
}

func (s *seqSource) Poll(_ context.Context, out Collector[seqRec]) error {
	time.Sleep(s.pollDelay)
	polled := 0
	for _, sp := range s.order {
		for polled < s.perPoll && s.owned[sp] < s.n && (s.stallAt == 0 || s.owned[sp] < s.stallAt) {
			round := s.owned[sp] + 1
			for k := sp; k < s.keys; k += s.splits {
				out.Collect(seqRec{Key: fmt.Sprintf("k%03d", k), Seq: int64(round)})
				if s.emitted != nil {
					s.emitted.Add(1)
				}
			}
			s.owned[sp] = round
			polled++
		}
	}
	if polled == 0 && s.stallAt == 0 {
		return ErrEndOfInput
	}
	return nil
}

func (s *seqSource) Snapshot(context.Context, checkpoint.ID) (OperatorState, error) {
	var st OperatorState
	for _, sp := range s.order {
		e := binary.BigEndian.AppendUint64(nil, uint64(sp))
		st.Entries = append(st.Entries, binary.BigEndian.AppendUint64(e, uint64(s.owned[sp])))
	}
	return st, nil
}

func (s *seqSource) Close() error { return nil }

// seqSourceOf returns a factory of copies of proto.
func seqSourceOf(proto seqSource) func() Source[seqRec] {
	return func() Source[seqRec] {
		s := proto
		return &s
	}
}

// seqChecker fails on any gap or repeat of a key's sequence, using keyed
// state: exactly-once state means every key sees 1, 2, ..., n once each.
type seqChecker struct {
	last       *ValueState[int64]
	violations *violations
}

func (c *seqChecker) Open(_ context.Context, st *StateRegistry[string]) error {
	var err error
	c.last, err = NewValueState[int64](st, "last", nil)
	return err
}

func (c *seqChecker) Process(key string, v seqRec, out Collector[seqRec]) error {
	last, _ := c.last.Value()
	if v.Seq != last+1 {
		c.violations.add(fmt.Sprintf("key %s: got %d after %d", key, v.Seq, last))
	}
	c.last.Update(v.Seq)
	out.Collect(v)
	return nil
}

type violations struct {
	mu   sync.Mutex
	list []string
}

func (v *violations) add(s string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.list = append(v.list, s)
}

func (v *violations) get() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.list...)
}

// memTxns stands in for a transactional external system: transactions are
// opened per checkpoint, survive the sink instance (as Kafka's do), and are
// committed or aborted by id.
type memTxns struct {
	mu        sync.Mutex
	open      map[string][]seqRec // transactional id -> records
	committed []seqRec
	done      map[string]bool
}

func newMemTxns() *memTxns {
	return &memTxns{open: map[string][]seqRec{}, done: map[string]bool{}}
}

func (m *memTxns) commit(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if recs, ok := m.open[id]; ok {
		m.committed = append(m.committed, recs...)
		delete(m.open, id)
		m.done[id] = true
	}
}

// abort drops the open transaction id.
func (m *memTxns) abort(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.open, id)
}

func (m *memTxns) abortAllBut(prefix string, keep map[string]bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id := range m.open {
		if len(id) >= len(prefix) && id[:len(prefix)] == prefix && !keep[id] {
			delete(m.open, id)
		}
	}
}

func (m *memTxns) output() []seqRec {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]seqRec(nil), m.committed...)
}

// txnSink is a two-phase-commit sink over memTxns.
type txnSink struct {
	txns    *memTxns
	oc      *OperatorContext
	cur     []seqRec
	pending []checkpoint.TxnHandle
	fp      func(string) error
	// delayOpen0 delays subtask 0's Open (a slow subtask on restore).
	delayOpen0 time.Duration
}

func (s *txnSink) Open(_ context.Context, oc *OperatorContext) error {
	if oc.Subtask == 0 {
		time.Sleep(s.delayOpen0)
	}
	s.oc, s.cur, s.pending = oc, nil, nil
	keep := map[string]bool{}
	for _, h := range oc.CommitHandles {
		s.txns.commit(h.TransactionalID)
		keep[h.TransactionalID] = true
	}
	// Abort whatever this subtask left open (lingering transactions).
	s.txns.abortAllBut(fmt.Sprintf("%s-%d-", oc.UID, oc.Subtask), keep)
	return nil
}

// CommitRestored implements RestoreCommitter: it commits every completed
// transaction of the operator before any subtask opens.
func (s *txnSink) CommitRestored(_ context.Context, oc *OperatorContext) error {
	for _, h := range append(slices.Clone(oc.CommitHandles), oc.OrphanHandles...) {
		s.txns.commit(h.TransactionalID)
	}
	return nil
}

func (s *txnSink) Write(_ context.Context, v seqRec) error {
	s.cur = append(s.cur, v)
	return nil
}

// Snapshot pre-commits the epoch's records and names every transaction
// still pending, those of aborted checkpoints included: a restore from this
// checkpoint must commit them (the AbortCarrier contract).
func (s *txnSink) Snapshot(_ context.Context, id checkpoint.ID) (OperatorState, error) {
	if len(s.cur) > 0 {
		h := checkpoint.TxnHandle{TransactionalID: fmt.Sprintf("%s-%d-%d", s.oc.UID, s.oc.Subtask, id), Checkpoint: id}
		s.txns.mu.Lock()
		s.txns.open[h.TransactionalID] = s.cur
		s.txns.mu.Unlock()
		s.cur = nil
		s.pending = append(s.pending, h)
		if s.fp != nil {
			if err := s.fp("sink.after-precommit"); err != nil {
				return OperatorState{}, err
			}
		}
	}
	return OperatorState{Handles: slices.Clone(s.pending)}, nil
}

func (s *txnSink) NotifyCheckpointComplete(_ context.Context, id checkpoint.ID) error {
	var rest []checkpoint.TxnHandle
	for _, h := range s.pending {
		if h.Checkpoint <= id {
			s.txns.commit(h.TransactionalID)
			if s.fp != nil {
				if err := s.fp("sink.after-commit"); err != nil {
					return err
				}
			}
		} else {
			rest = append(rest, h)
		}
	}
	s.pending = rest
	return nil
}

// NotifyCheckpointAborted keeps the aborted checkpoint's transaction
// pending for the next completed checkpoint.
func (s *txnSink) NotifyCheckpointAborted(context.Context, checkpoint.ID) error { return nil }

// CarriesAbortedCheckpoints implements checkpoint.AbortCarrier.
func (s *txnSink) CarriesAbortedCheckpoints() {}

func (s *txnSink) Close() error { return nil }

// randomFailpoints fails named points at random, a bounded number of times.
type randomFailpoints struct {
	mu    sync.Mutex
	r     *rand.Rand
	prob  map[string]float64
	left  int
	fired map[string]int
}

func (f *randomFailpoints) Inject(name string) error {
	p := f.prob[name]
	if p == 0 {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.left > 0 && f.r.Float64() < p {
		f.left--
		f.fired[name]++
		return fmt.Errorf("injected failure at %s", name)
	}
	return nil
}

// checkSequences asserts that out holds, per key, exactly 1..n in order.
func checkSequences(t *testing.T, out []seqRec, keys, n int) {
	t.Helper()
	next := map[string]int64{}
	for _, r := range out {
		if r.Seq != next[r.Key]+1 {
			t.Fatalf("key %s: committed %d after %d (duplicate or loss)", r.Key, r.Seq, next[r.Key])
		}
		next[r.Key] = r.Seq
	}
	if len(next) != keys {
		t.Fatalf("committed output has %d keys, want %d", len(next), keys)
	}
	for k, last := range next {
		if last != int64(n) {
			t.Fatalf("key %s: last committed %d, want %d", k, last, n)
		}
	}
	if len(out) != keys*n {
		t.Fatalf("committed %d records, want %d", len(out), keys*n)
	}
}
