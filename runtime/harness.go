package runtime

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
)

// This file is the seam of package weirtest, Weir's public test kit: it
// drives one subtask of one operator of a job graph on the caller's
// goroutine, with no task, channel or cluster, through the operator
// instance a task runs (newInstance, input, advanceWatermark,
// fireProcessingTime, snapshot, restore, notify, close) and the restore
// assignment a job's restart uses (AssignState). Write tests with weirtest;
// this API exists for it and is kept to what it needs.

// ErrHarness is wrapped by the errors of an OperatorHarness's misuse: an
// operator it cannot drive, a record of a key group the subtask does not
// own, time going back.
var ErrHarness = errors.New("operator harness")

// HarnessConfig configures NewOperatorHarness (for weirtest).
type HarnessConfig struct {
	// Subtask and Parallelism place the harness's subtask (default 0 of 1).
	Subtask, Parallelism int
	// Restore are operator snapshots (of any subtasks, at any parallelism)
	// to restore from, assigned to the subtask by AssignState as a restart
	// assigns them; nil: a fresh start.
	Restore []checkpoint.OperatorSnapshot
	// Output receives every record of the main output, with its event
	// timestamp (NoTimestamp: none).
	Output func(v any, ts int64)
	// Side receives every record emitted to a side output, by tag id,
	// whether or not the job reads it.
	Side func(tag string, v any, ts int64)
	// Clock is the processing time (epoch ms) the operator's timer
	// service reads; nil: the wall clock.
	Clock func() int64
}

// OperatorHarness drives one subtask of one operator (for weirtest; see
// there). Its methods run the operator on the caller's goroutine and are
// not safe for concurrent use.
type OperatorHarness struct {
	n       *node
	maxPar  int
	sub     int
	par     int
	inst    instance
	oc      *OperatorContext
	inputs  []any // per input edge: the pushFn of the edge's record type
	keyed   []any // per input edge: func(T, int) error taking the key group, or nil
	owned   map[int]bool
	wm      int64
	procNow int64
	opened  bool
	closed  bool
}

// NewOperatorHarness instantiates the operator that produces s (its main
// output), restores it as cfg says, and opens it. Every input of the
// operator must come straight from a source of the job: the harness feeds
// those inputs itself (PushInput).
func NewOperatorHarness[U any](ctx context.Context, s *Stream[U], cfg HarnessConfig) (*OperatorHarness, error) {
	j := s.job
	if _, err := compile(j); err != nil { // the checks a job's start makes
		return nil, err
	}
	n := s.node
	if s.side != "" {
		return nil, fmt.Errorf("%w: the stream is side output %q of %q: give the operator's main output", ErrHarness, s.side, n.name)
	}
	if n.kind != kindOperator {
		return nil, fmt.Errorf("%w: %q is a source or a sink, not an operator", ErrHarness, n.name)
	}
	for _, e := range n.inputs {
		if e.from.kind != kindSource || e.tag != "" {
			return nil, fmt.Errorf("%w: an input of %q comes from %q, not from the harness's input", ErrHarness, n.name, e.from.name)
		}
	}
	if cfg.Parallelism == 0 {
		cfg.Parallelism = 1
	}
	if cfg.Parallelism < 1 || cfg.Subtask < 0 || cfg.Subtask >= cfg.Parallelism {
		return nil, fmt.Errorf("%w: subtask %d of parallelism %d", ErrHarness, cfg.Subtask, cfg.Parallelism)
	}
	if n.keyed && cfg.Parallelism > j.maxParallelism {
		return nil, fmt.Errorf("%w: keyed operator %q: parallelism %d exceeds max parallelism %d", ErrInvalidJob, n.name, cfg.Parallelism, j.maxParallelism)
	}
	h := &OperatorHarness{n: n, maxPar: j.maxParallelism, sub: cfg.Subtask, par: cfg.Parallelism, wm: MinWatermark}
	var restore *SubtaskState
	if cfg.Restore != nil {
		layout := OperatorLayout{UID: n.uid, Parallelism: cfg.Parallelism, Union: n.union, BroadcastState: n.broadcastState}
		if n.keyed {
			layout.MaxParallelism = j.maxParallelism
		}
		snaps := make([]checkpoint.OperatorSnapshot, len(cfg.Restore))
		copy(snaps, cfg.Restore)
		c := checkpoint.Completed{Job: j.name, ID: 1, Tasks: map[checkpoint.TaskID]checkpoint.TaskSnapshot{}}
		for i, sn := range snaps {
			if sn.UID != n.uid {
				return nil, fmt.Errorf("%w: a snapshot of operator %q restored into %q", ErrIncompatibleState, sn.UID, n.uid)
			}
			c.Tasks[checkpoint.TaskID(fmt.Sprintf("%s#%d", sn.UID, i))] = checkpoint.TaskSnapshot{Operators: []checkpoint.OperatorSnapshot{sn}}
		}
		a, err := AssignState([]OperatorLayout{layout}, RestoreInput{Checkpoint: c})
		if err != nil {
			return nil, err
		}
		restore = a.Subtasks[OperatorSubtask{n.uid, cfg.Subtask}]
	}
	if n.keyed {
		h.owned = map[int]bool{}
		for _, kg := range KeyGroupRange(cfg.Subtask, j.maxParallelism, cfg.Parallelism) {
			h.owned[kg] = true
		}
	}
	now := &recordTime{ts: NoTimestamp}
	oc := &OperatorContext{Job: j.name, Name: n.name, UID: n.uid, Subtask: cfg.Subtask, Parallelism: cfg.Parallelism,
		Logger: zap.NewNop(), RequestCheckpoint: func(string) {}, now: now, sides: map[string]any{}}
	if restore != nil {
		oc.RestoredFrom, oc.Restored = restore.From, restore.Entries
	}
	if cfg.Side != nil {
		oc.sideAny = func(tag string, v any) error { cfg.Side(tag, v, now.ts); return nil }
	}
	if cfg.Clock != nil {
		oc.clock = func() time.Time { return time.UnixMilli(cfg.Clock()) }
	}
	output := cfg.Output
	if output == nil {
		output = func(any, int64) {}
	}
	inst, err := n.newInstance(oc, n.collect(func(v any) error { output(v, now.ts); return nil }))
	if err != nil {
		return nil, fmt.Errorf("operator %q: %w", n.name, err)
	}
	h.inst, h.oc = inst, oc
	head := inst.input()
	var headKG any
	if kh, ok := inst.(interface{ inputWithKeyGroup() any }); ok {
		headKG = kh.inputWithKeyGroup()
	}
	for _, e := range n.inputs {
		in, kin := head, headKG
		if e.adapt != nil {
			in, kin = e.adapt(head, headKG)
		}
		if e.kind != edgeHash {
			kin = nil
		}
		h.inputs, h.keyed = append(h.inputs, in), append(h.keyed, kin)
	}
	if restore != nil {
		if err := inst.restore(restore); err != nil {
			_ = inst.close()
			return nil, fmt.Errorf("restore %s: %w", n.name, err)
		}
	}
	if err := inst.open(ctx); err != nil {
		_ = inst.close()
		return nil, fmt.Errorf("open %s: %w", n.name, err)
	}
	h.opened = true
	return h, nil
}

// PushInput processes v, with event timestamp ts (NoTimestamp: none), on
// input i of h's operator (0: the first; 1: the second of a two-input
// operator), as a task delivers a record. A keyed operator's record must
// be of a key group the subtask owns.
func PushInput[T any](h *OperatorHarness, i int, v T, ts int64) (err error) {
	if err := h.usable(); err != nil {
		return err
	}
	if i < 0 || i >= len(h.inputs) {
		return fmt.Errorf("%w: %q has %d inputs, not an input %d", ErrHarness, h.n.name, len(h.inputs), i)
	}
	defer recoverInto(&err)
	h.oc.now.ts = ts
	if kgOf, ok := h.n.inputs[i].keyGroup.(func(T) int); ok && h.keyed[i] != nil {
		kg := kgOf(v)
		if !h.owned[kg] {
			return fmt.Errorf("%w: the record's key is in key group %d, which subtask %d of %d does not own (subtask %d does)",
				ErrHarness, kg, h.sub, h.par, SubtaskOf(kg, h.maxPar, h.par))
		}
		push, ok := h.keyed[i].(func(T, int) error)
		if !ok {
			return fmt.Errorf("%w: input %d of %q does not take %T", ErrHarness, i, h.n.name, v)
		}
		return push(v, kg)
	}
	push, ok := h.inputs[i].(pushFn[T])
	if !ok {
		return fmt.Errorf("%w: input %d of %q does not take %T", ErrHarness, i, h.n.name, v)
	}
	return push(v)
}

// HarnessKeyGroup returns the key group of v on input i of a keyed operator, and
// the subtask of h's parallelism that owns it (ok false: not keyed).
func HarnessKeyGroup[T any](h *OperatorHarness, i int, v T) (kg, subtask int, ok bool) {
	if i < 0 || i >= len(h.n.inputs) {
		return 0, 0, false
	}
	kgOf, ok := h.n.inputs[i].keyGroup.(func(T) int)
	if !ok {
		return 0, 0, false
	}
	kg = kgOf(v)
	return kg, SubtaskOf(kg, h.maxPar, h.par), true
}

// usable refuses a harness that is closed.
func (h *OperatorHarness) usable() error {
	if h.closed {
		return fmt.Errorf("%w: %q is closed", ErrHarness, h.n.name)
	}
	return nil
}

// Watermark advances the operator's input watermark to wm, as a task does
// when every input's watermark passed it: event-time timers at or before
// wm fire. A watermark never goes back.
func (h *OperatorHarness) Watermark(ctx context.Context, wm int64) (err error) {
	if err := h.usable(); err != nil {
		return err
	}
	if wm < h.wm {
		return fmt.Errorf("%w: watermark %d after %d: a watermark never goes back", ErrHarness, wm, h.wm)
	}
	h.wm = wm
	defer recoverInto(&err)
	if wh, ok := h.inst.(watermarkHandler); ok {
		return wh.advanceWatermark(ctx, wm)
	}
	return nil
}

// CurrentWatermark is the input watermark the harness last advanced to.
func (h *OperatorHarness) CurrentWatermark() int64 { return h.wm }

// FireProcessingTime fires the processing-time timers due at now (epoch
// ms), as a task does when its wake-up fires; the caller's Clock must
// already read now. Time never goes back.
func (h *OperatorHarness) FireProcessingTime(now int64) (err error) {
	if err := h.usable(); err != nil {
		return err
	}
	if now < h.procNow {
		return fmt.Errorf("%w: processing time %d after %d: time never goes back", ErrHarness, now, h.procNow)
	}
	h.procNow = now
	defer recoverInto(&err)
	if th, ok := h.inst.(processingTimeHandler); ok && th.hasTimers() {
		return th.fireProcessingTime(now)
	}
	return nil
}

// Snapshot takes the operator's snapshot for checkpoint id, both its
// synchronous and asynchronous parts, as a task does at a barrier.
func (h *OperatorHarness) Snapshot(ctx context.Context, id checkpoint.ID) (_ checkpoint.OperatorSnapshot, err error) {
	if err := h.usable(); err != nil {
		return checkpoint.OperatorSnapshot{}, err
	}
	defer recoverInto(&err)
	s, async, err := h.inst.snapshot(ctx, id)
	if err != nil {
		return checkpoint.OperatorSnapshot{}, err
	}
	if async != nil {
		if s.KeyGroups, err = async(); err != nil {
			return checkpoint.OperatorSnapshot{}, err
		}
	}
	s.UID, s.Subtask, s.Parallelism = h.n.uid, h.sub, h.par
	if err := s.EncodeKeyGroups(); err != nil {
		return checkpoint.OperatorSnapshot{}, err
	}
	return s, nil
}

// Notify tells the operator that checkpoint id completed (or was aborted).
func (h *OperatorHarness) Notify(ctx context.Context, id checkpoint.ID, complete bool) (err error) {
	if err := h.usable(); err != nil {
		return err
	}
	defer recoverInto(&err)
	return h.inst.notify(ctx, id, complete)
}

// KeyedState calls emit for every entry of the keyed operator's state
// (values, map entries, window contents, timers), decoded with the codecs
// its function declared, key group by key group, as ReadKeyedState reads
// a snapshot. It reads the live state through a snapshot: nothing changes.
func (h *OperatorHarness) KeyedState(emit func(StateRecord) error) (err error) {
	d, ok := h.inst.(interface {
		dumpState(emit func(StateRecord) error) error
	})
	if !ok {
		return fmt.Errorf("%w: %q", ErrNotKeyed, h.n.uid)
	}
	defer recoverInto(&err)
	return d.dumpState(emit)
}

// Close closes the operator (once).
func (h *OperatorHarness) Close() (err error) {
	if h.closed {
		return nil
	}
	h.closed = true
	defer recoverInto(&err)
	return h.inst.close()
}

// UID is the operator's uid.
func (h *OperatorHarness) UID() string { return h.n.uid }

// dumpState implements OperatorHarness.KeyedState.
func (k *keyedInstance[K, T, U]) dumpState(emit func(StateRecord) error) error {
	blobs, err := k.backend.snapshot()()
	if err != nil {
		return err
	}
	kgs := make([]int, 0, len(blobs))
	for kg := range blobs {
		kgs = append(kgs, kg)
	}
	sort.Ints(kgs)
	r := backendReader[K]{k.backend}
	for _, kg := range kgs {
		err := splitKeyGroup(blobs[kg], func(name string, data []byte) error {
			if ok, err := r.dump(kg, name, data, emit); ok || err != nil {
				return err
			}
			return dumpRaw(kg, name, data, r, emit)
		})
		if err != nil {
			return fmt.Errorf("key group %d: %w", kg, err)
		}
	}
	return nil
}
