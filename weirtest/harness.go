package weirtest

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/runtime"
)

// Record is a record an operator emitted, with its event timestamp
// (runtime.NoTimestamp: none, as the output of a processing-time timer).
type Record[T any] struct {
	Value     T
	Timestamp int64
}

// Opt configures a harness.
type Opt interface{ apply(*cfg) }

type cfg struct {
	subtask, parallelism int
	maxParallelism       int
	restore              *Snapshot
	procTime             int64
}

type opt func(*cfg)

func (o opt) apply(c *cfg) { o(c) }

// Subtask makes the harness subtask i of an operator of the given
// parallelism (default: 0 of 1). A keyed harness then owns the key groups
// Weir gives that subtask, restores only those, and refuses a record of
// another key.
func Subtask(i, parallelism int) Opt {
	return opt(func(c *cfg) { c.subtask, c.parallelism = i, parallelism })
}

// MaxParallelism sets the number of key groups (default
// runtime.DefaultMaxParallelism), as runtime.MaxParallelism does for a job.
func MaxParallelism(n int) Opt { return opt(func(c *cfg) { c.maxParallelism = n }) }

// RestoreFrom restores the operator from s before it opens, as a job
// restarting from a checkpoint holding s restores it: at the harness's
// parallelism, whatever the parallelism s was taken at.
func RestoreFrom(s Snapshot) Opt { return opt(func(c *cfg) { c.restore = &s }) }

// StartProcessingTime sets the harness's processing-time clock (epoch ms)
// when it opens (default 0).
func StartProcessingTime(ms int64) Opt { return opt(func(c *cfg) { c.procTime = ms }) }

// Snapshot is an operator's snapshot taken by a harness, or the snapshots
// of several subtasks merged (Merge): what a checkpoint holds of the
// operator.
type Snapshot struct {
	ops []checkpoint.OperatorSnapshot
}

// Merge returns the snapshots of s and others together, as one checkpoint
// holds those of every subtask of an operator.
func (s Snapshot) Merge(others ...Snapshot) Snapshot {
	out := Snapshot{ops: append([]checkpoint.OperatorSnapshot(nil), s.ops...)}
	for _, o := range others {
		out.ops = append(out.ops, o.ops...)
	}
	return out
}

// SnapshotOf returns what c, a job's completed checkpoint or savepoint
// (checkpoint.ReadSavepoint reads one), holds of the operator uid, every
// subtask's, to restore into a harness with RestoreFrom as the job would
// restore it: a test of a new version of an operator against the state an
// older one saved. State c keeps in checkpoint storage (references, not
// bytes) is refused: read a savepoint, which holds its state.
func SnapshotOf(c checkpoint.Completed, uid string) (Snapshot, error) {
	var s Snapshot
	for _, t := range c.Tasks {
		for _, op := range t.Operators {
			if op.UID != uid {
				continue
			}
			if len(op.StateRefs) > 0 || len(op.KeyGroupRefs) > 0 || op.Native != nil {
				return Snapshot{}, fmt.Errorf("weirtest: checkpoint %d keeps operator %q's state in checkpoint storage: restore from a savepoint", c.ID, uid)
			}
			s.ops = append(s.ops, op)
		}
	}
	if len(s.ops) == 0 {
		return Snapshot{}, fmt.Errorf("weirtest: checkpoint %d holds no operator %q", c.ID, uid)
	}
	sort.Slice(s.ops, func(i, j int) bool { return s.ops[i].Subtask < s.ops[j].Subtask })
	return s, nil
}

// Operators returns the operator snapshots s holds, one per subtask.
func (s Snapshot) Operators() []checkpoint.OperatorSnapshot {
	return append([]checkpoint.OperatorSnapshot(nil), s.ops...)
}

// Timer is a timer registered in a keyed operator.
type Timer[K comparable] struct {
	Key K
	// Service is "timers" for a KeyedProcessor's TimerService, or
	// "timers/NAME" for timers declared with runtime.NewTimers.
	Service string
	// Namespace is a namespaced timer's namespace (nil for the
	// TimerService's).
	Namespace any
	Domain    runtime.TimeDomain
	Timestamp int64
}

// AnyHarness is any harness of this package (for SideOutput).
type AnyHarness interface {
	base() *harness
}

// harness is what every harness shares: the runtime's operator harness,
// the collected output, the clock.
type harness struct {
	op     *runtime.OperatorHarness
	out    []Record[any]
	sides  []sideRecord
	now    int64
	nextID checkpoint.ID
	maxPar int
}

type sideRecord struct {
	tag string
	Record[any]
}

func (h *harness) base() *harness { return h }

// build makes the job graph around the operator: one source per input
// (the harness feeds them), then the operator build adds.
func newHarness[U any](opts []Opt, build func(j *runtime.Job) *runtime.Stream[U]) (*harness, error) {
	c := cfg{parallelism: 1, maxParallelism: runtime.DefaultMaxParallelism}
	for _, o := range opts {
		o.apply(&c)
	}
	j := runtime.NewJob("weirtest", runtime.MaxParallelism(c.maxParallelism))
	s := build(j)
	if s == nil {
		return nil, fmt.Errorf("%w: the build function returned no stream", runtime.ErrHarness)
	}
	h := &harness{now: c.procTime, nextID: 1, maxPar: c.maxParallelism}
	rc := runtime.HarnessConfig{Subtask: c.subtask, Parallelism: c.parallelism,
		Output: func(v any, ts int64) { h.out = append(h.out, Record[any]{v, ts}) },
		Side:   func(tag string, v any, ts int64) { h.sides = append(h.sides, sideRecord{tag, Record[any]{v, ts}}) },
		Clock:  func() int64 { return h.now }}
	if c.restore != nil {
		rc.Restore = c.restore.ops
		if rc.Restore == nil {
			rc.Restore = []checkpoint.OperatorSnapshot{}
		}
	}
	op, err := runtime.NewOperatorHarness(context.Background(), s, rc)
	if err != nil {
		return nil, err
	}
	h.op = op
	return h, nil
}

// noSource is the source of a harness's input: never run (the harness
// pushes the input's records itself).
type noSource[T any] struct{}

func (noSource[T]) Open(context.Context, *runtime.OperatorContext) error { return nil }
func (noSource[T]) Poll(context.Context, runtime.Collector[T]) error     { return runtime.ErrEndOfInput }
func (noSource[T]) Snapshot(context.Context, checkpoint.ID) (runtime.OperatorState, error) {
	return runtime.OperatorState{}, nil
}
func (noSource[T]) Close() error { return nil }

func input[T any](j *runtime.Job, name string) *runtime.Stream[T] {
	return runtime.FromSource(j, name, func() runtime.Source[T] { return noSource[T]{} })
}

// Harness drives one subtask of an operator: its output is of type U. The
// keyed harnesses embed it.
type Harness[U any] struct {
	h *harness
}

func (h *Harness[U]) base() *harness { return h.h }

// ProcessWatermark advances the operator's input watermark to wm, as the
// task does when every input passed it: event-time timers (and windows)
// due at wm fire, in timestamp order, before it returns. A watermark never
// goes back (an error).
func (h *Harness[U]) ProcessWatermark(wm int64) error {
	return h.h.op.Watermark(context.Background(), wm)
}

// CurrentWatermark is the operator's input watermark
// (runtime.MinWatermark before the first).
func (h *Harness[U]) CurrentWatermark() int64 { return h.h.op.CurrentWatermark() }

// SetProcessingTime sets the processing-time clock the operator reads to
// ms (epoch milliseconds) and fires every processing-time timer due at
// ms, in timestamp order, before it returns. Time never goes back (an
// error).
func (h *Harness[U]) SetProcessingTime(ms int64) error {
	if ms < h.h.now {
		return fmt.Errorf("%w: processing time %d after %d: time never goes back", runtime.ErrHarness, ms, h.h.now)
	}
	h.h.now = ms
	return h.h.op.FireProcessingTime(ms)
}

// AdvanceProcessingTime moves the processing-time clock forward by d (see
// SetProcessingTime).
func (h *Harness[U]) AdvanceProcessingTime(d time.Duration) error {
	return h.SetProcessingTime(h.h.now + d.Milliseconds())
}

// ProcessingTime is the harness's processing-time clock (epoch ms).
func (h *Harness[U]) ProcessingTime() int64 { return h.h.now }

// Output returns the main output collected so far, in order, with each
// record's timestamp.
func (h *Harness[U]) Output() []Record[U] {
	out := make([]Record[U], len(h.h.out))
	for i, r := range h.h.out {
		v, _ := r.Value.(U)
		out[i] = Record[U]{v, r.Timestamp}
	}
	return out
}

// Values returns the values of Output.
func (h *Harness[U]) Values() []U {
	out := make([]U, len(h.h.out))
	for i, r := range h.h.out {
		out[i], _ = r.Value.(U)
	}
	return out
}

// TakeOutput returns Output and forgets it: the next call returns only
// what the operator emitted after this one. Side outputs are kept.
func (h *Harness[U]) TakeOutput() []Record[U] {
	out := h.Output()
	h.h.out = h.h.out[:0]
	return out
}

// Snapshot takes the operator's snapshot, as at a checkpoint's barrier
// (both its parts). Restore it into a fresh harness with RestoreFrom.
func (h *Harness[U]) Snapshot() (Snapshot, error) {
	id := h.h.nextID
	h.h.nextID++
	s, err := h.h.op.Snapshot(context.Background(), id)
	if err != nil {
		return Snapshot{}, err
	}
	return Snapshot{ops: []checkpoint.OperatorSnapshot{s}}, nil
}

// NotifyCheckpointComplete tells the operator that its latest snapshot's
// checkpoint completed (a function that is a checkpoint.Listener hears it).
func (h *Harness[U]) NotifyCheckpointComplete() error {
	return h.h.op.Notify(context.Background(), h.h.nextID-1, true)
}

// Close closes the operator. A harness closed is of no further use.
func (h *Harness[U]) Close() error { return h.h.op.Close() }

// SideOutput returns what the harness's operator emitted to the side
// output tag so far, in order, with timestamps: every side output is
// collected, whether or not a job would read it.
func SideOutput[T any](h AnyHarness, tag runtime.OutputTag[T]) []Record[T] {
	var out []Record[T]
	for _, r := range h.base().sides {
		if r.tag != tag.ID() {
			continue
		}
		v, _ := r.Value.(T)
		out = append(out, Record[T]{v, r.Timestamp})
	}
	return out
}

// NewHarness drives an operator without keyed state (a Map, a FlatMap, a
// Filter) on a stream of T: build adds it to the input stream and returns
// its output.
func NewHarness[T, U any](build func(in *runtime.Stream[T]) *runtime.Stream[U], opts ...Opt) (*OneInputHarness[T, U], error) {
	h, err := newHarness(opts, func(j *runtime.Job) *runtime.Stream[U] { return build(input[T](j, "weirtest.input")) })
	if err != nil {
		return nil, err
	}
	return &OneInputHarness[T, U]{Harness[U]{h}}, nil
}

// OneInputHarness drives an operator without keyed state (NewHarness).
type OneInputHarness[T, U any] struct {
	Harness[U]
}

// ProcessElement processes v with event timestamp ts (runtime.NoTimestamp:
// none).
func (h *OneInputHarness[T, U]) ProcessElement(v T, ts int64) error {
	return runtime.PushInput(h.h.op, 0, v, ts)
}

// keyed is what both keyed harnesses share: state and timers by key.
type keyed[K comparable] struct {
	h *harness
}

// KeyedStateReader is a keyed harness, read by Value and MapEntries.
type KeyedStateReader[K comparable] interface {
	// State returns every entry of the key's keyed state (timers aside).
	State(key K) ([]runtime.StateRecord, error)
}

// State returns every entry of key's keyed state (values, map entries, a
// window operator's contents), timers aside, decoded with the codecs the
// operator declared: what a checkpoint would hold of it.
func (k keyed[K]) State(key K) ([]runtime.StateRecord, error) {
	var out []runtime.StateRecord
	err := k.h.op.KeyedState(func(r runtime.StateRecord) error {
		if r.Timer == nil && r.Key != nil && r.Key == any(key) {
			out = append(out, r)
		}
		return nil
	})
	return out, err
}

// Timers lists the operator's registered timers, of every key, by domain
// (event time first), then timestamp.
func (k keyed[K]) Timers() ([]Timer[K], error) {
	var out []Timer[K]
	err := k.h.op.KeyedState(func(r runtime.StateRecord) error {
		if r.Timer == nil {
			return nil
		}
		key, _ := r.Key.(K)
		d := runtime.EventTime
		if r.Timer.Domain == runtime.ProcessingTime.String() {
			d = runtime.ProcessingTime
		}
		out = append(out, Timer[K]{Key: key, Service: r.State, Namespace: r.Namespace, Domain: d, Timestamp: r.Timer.Timestamp})
		return nil
	})
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Domain != out[j].Domain {
			return out[i].Domain < out[j].Domain
		}
		return out[i].Timestamp < out[j].Timestamp
	})
	return out, err
}

// Value returns key's value of the value state named state, and whether it
// is set.
func Value[V any, K comparable](h KeyedStateReader[K], state string, key K) (V, bool, error) {
	var zero V
	recs, err := h.State(key)
	if err != nil {
		return zero, false, err
	}
	for _, r := range recs {
		if r.State != state {
			continue
		}
		if r.Undecoded != "" {
			return zero, false, fmt.Errorf("state %q of key %v: %s", state, key, r.Undecoded)
		}
		v, ok := r.Value.(V)
		if !ok {
			return zero, false, fmt.Errorf("state %q of key %v holds %T, not %T", state, key, r.Value, zero)
		}
		return v, true, nil
	}
	return zero, false, nil
}

// MapEntries returns key's map of the map state named state (empty if it
// has none).
func MapEntries[UK comparable, UV any, K comparable](h KeyedStateReader[K], state string, key K) (map[UK]UV, error) {
	recs, err := h.State(key)
	if err != nil {
		return nil, err
	}
	out := map[UK]UV{}
	for _, r := range recs {
		if r.State != state {
			continue
		}
		if r.Undecoded != "" {
			return nil, fmt.Errorf("state %q of key %v: %s", state, key, r.Undecoded)
		}
		mk, ok1 := r.MapKey.(UK)
		mv, ok2 := r.Value.(UV)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("state %q of key %v holds %T -> %T, not %T -> %T", state, key, r.MapKey, r.Value, mk, mv)
		}
		out[mk] = mv
	}
	return out, nil
}

// KeyedHarness drives one subtask of a keyed one-input operator: a
// runtime.ProcessKeyed or runtime.Process function, a window
// (runtime.Window with Aggregate, ReduceWindow, ProcessWindow...), a
// runtime.Reduce.
type KeyedHarness[K comparable, T, U any] struct {
	Harness[U]
	keyed[K]
}

// NewKeyedHarness makes a harness for the keyed operator build adds to a
// stream of T keyed by key (kc encodes keys, nil: runtime.DefaultCodec, as
// runtime.KeyBy takes it); build returns the operator's output. The
// operator is opened (and restored, with RestoreFrom) before it returns.
//
// A harness is driven by the test's goroutine; nothing runs between two
// calls, and no call waits on the wall clock.
func NewKeyedHarness[K comparable, T, U any](key func(T) K, kc runtime.Codec[K], build func(ks *runtime.KeyedStream[K, T]) *runtime.Stream[U], opts ...Opt) (*KeyedHarness[K, T, U], error) {
	h, err := newHarness(opts, func(j *runtime.Job) *runtime.Stream[U] {
		return build(runtime.KeyBy(input[T](j, "weirtest.input"), key, kc))
	})
	if err != nil {
		return nil, err
	}
	return &KeyedHarness[K, T, U]{Harness[U]{h}, keyed[K]{h}}, nil
}

// ProcessElement processes v with event timestamp ts (runtime.NoTimestamp:
// none), its key in scope, as the task delivers a record. A record whose
// key the harness's subtask does not own (see Subtask) is an error naming
// the subtask that does.
func (h *KeyedHarness[K, T, U]) ProcessElement(v T, ts int64) error {
	return runtime.PushInput(h.Harness.h.op, 0, v, ts)
}

// SubtaskOf is the subtask, at the harness's parallelism, that owns v's
// key: Weir's key-group assignment.
func (h *KeyedHarness[K, T, U]) SubtaskOf(v T) int {
	_, sub, _ := runtime.HarnessKeyGroup(h.Harness.h.op, 0, v)
	return sub
}

// KeyedTwoInputHarness drives one subtask of a keyed two-input operator:
// runtime.ProcessConnected, runtime.IntervalJoin, runtime.CoGroupWindow,
// runtime.WindowJoin.
type KeyedTwoInputHarness[K comparable, A, B, U any] struct {
	Harness[U]
	keyed[K]
}

// NewKeyedTwoInputHarness makes a harness for the two-input keyed
// operator build adds to a stream of A keyed by keyA and a stream of B
// keyed by keyB (kc encodes keys of both, nil: runtime.DefaultCodec).
func NewKeyedTwoInputHarness[K comparable, A, B, U any](keyA func(A) K, keyB func(B) K, kc runtime.Codec[K],
	build func(left *runtime.KeyedStream[K, A], right *runtime.KeyedStream[K, B]) *runtime.Stream[U], opts ...Opt) (*KeyedTwoInputHarness[K, A, B, U], error) {
	h, err := newHarness(opts, func(j *runtime.Job) *runtime.Stream[U] {
		return build(runtime.KeyBy(input[A](j, "weirtest.left"), keyA, kc), runtime.KeyBy(input[B](j, "weirtest.right"), keyB, kc))
	})
	if err != nil {
		return nil, err
	}
	return &KeyedTwoInputHarness[K, A, B, U]{Harness[U]{h}, keyed[K]{h}}, nil
}

// ProcessElement1 processes v of the first (left) input with event
// timestamp ts.
func (h *KeyedTwoInputHarness[K, A, B, U]) ProcessElement1(v A, ts int64) error {
	return runtime.PushInput(h.Harness.h.op, 0, v, ts)
}

// ProcessElement2 processes v of the second (right) input with event
// timestamp ts.
func (h *KeyedTwoInputHarness[K, A, B, U]) ProcessElement2(v B, ts int64) error {
	return runtime.PushInput(h.Harness.h.op, 1, v, ts)
}
