package runtime

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"
)

// TimeDomain says which clock a timer follows.
type TimeDomain uint8

const (
	// EventTime timers fire when the operator's input watermark reaches
	// their timestamp.
	EventTime TimeDomain = iota + 1
	// ProcessingTime timers fire when the wall clock (epoch ms) reaches
	// their timestamp.
	ProcessingTime
)

func (d TimeDomain) String() string {
	switch d {
	case EventTime:
		return "event-time"
	case ProcessingTime:
		return "processing-time"
	}
	return fmt.Sprintf("TimeDomain(%d)", uint8(d))
}

// TimerService registers and deletes timers of the current key (Flink's
// TimerService): a KeyedProcessor gets it from its KeyedContext. There is
// at most one timer per key, time domain and timestamp: registering it
// again does nothing. Timers are keyed state: checkpointed with their key
// group, restored at any parallelism; a processing-time timer that came due
// while the job was down fires right after the restore.
type TimerService interface {
	// CurrentProcessingTime is the wall clock in epoch milliseconds.
	CurrentProcessingTime() int64
	// CurrentWatermark is the operator's input watermark (MinWatermark
	// before the first).
	CurrentWatermark() int64
	RegisterEventTimeTimer(ts int64)
	RegisterProcessingTimeTimer(ts int64)
	DeleteEventTimeTimer(ts int64)
	DeleteProcessingTimeTimer(ts int64)
}

// Timers is a named timer service of a keyed operator whose timers carry a
// namespace of type N besides the current key (a window, for a window
// operator): one timer per key, namespace, time domain and timestamp.
// Declare it in Open with NewTimers; the operator's OnTimer receives its
// timers, and Namespace tells which namespace fired.
type Timers[K comparable, N comparable] struct {
	svcName  string
	host     *timerHost[K]
	keyCodec Codec[K]
	nsCodec  Codec[N]
	q        [2]timerStore[timerOwner[K, N]] // by TimeDomain-1
	kbuf     []byte
	// firing is the timer being fired (timerHost.firing points to it
	// during OnTimer), reused from timer to timer.
	firing firingTimer
	// moreEvent, if set, adds to a snapshot's event-time timers those that
	// another store keeps for these timers (the window operator's aligned
	// windows, window_aligned.go).
	moreEvent func(frozenTimers, ownerEncoder[timerOwner[K, N]]) frozenTimers
}

// timerOwner is the key and namespace of a timer of a Timers (the
// namespace first: a zero-size one, as the default timers', then takes no
// room).
type timerOwner[K comparable, N comparable] struct {
	ns  N
	key K
}

// NewTimers declares a timer service named name with namespaces of type N
// encoded by nc (nil: DefaultCodec). Its timers are snapshotted as keyed
// state under the name (distinct from every state name); declaring the same
// name twice is an error.
func NewTimers[N comparable, K comparable](st *StateRegistry[K], name string, nc Codec[N]) (*Timers[K, N], error) {
	if nc == nil {
		if err := CheckDefaultCodec[N](); err != nil {
			return nil, Unrecoverable(fmt.Errorf("timers %q namespace: %w", name, err))
		}
		nc = DefaultCodec[N]()
	}
	t := &Timers[K, N]{svcName: name, host: st.b.timers, keyCodec: st.b.keyCodec, nsCodec: nc}
	if p := st.b.pebble; p != nil {
		t.q = [2]timerStore[timerOwner[K, N]]{
			newEncodedTimers(newPebbleTimers(p, name, pebbleKindEventTimers), t.appendOwner, t.decodeOwner),
			newEncodedTimers(newPebbleTimers(p, name, pebbleKindProcTimers), t.appendOwner, t.decodeOwner)}
	} else {
		ev, proc := newTimerQueue(t.appendOwner), newTimerQueue(t.appendOwner)
		ev.cmp = ownerOrder[K, N](t.keyCodec)
		proc.cmp = ev.cmp
		t.q = [2]timerStore[timerOwner[K, N]]{heapTimers[timerOwner[K, N]]{ev}, heapTimers[timerOwner[K, N]]{proc}}
	}
	if err := st.b.register(t); err != nil {
		return nil, err
	}
	st.b.timers.services = append(st.b.timers.services, t)
	return t, nil
}

// owner is the current key and ns.
func (t *Timers[K, N]) owner(ns N) timerOwner[K, N] {
	return timerOwner[K, N]{ns: ns, key: t.host.scope.key}
}

// appendOwner appends o's encoding, as snapshots hold it: the framed
// encoded key, then the framed encoded namespace.
func (t *Timers[K, N]) appendOwner(dst []byte, o timerOwner[K, N]) []byte {
	t.kbuf = t.keyCodec.Append(t.kbuf[:0], o.key)
	dst = appendFrame(dst, t.kbuf)
	t.kbuf = t.nsCodec.Append(t.kbuf[:0], o.ns)
	return appendFrame(dst, t.kbuf)
}

// ownerOrder returns a comparison of owners in the order of their
// encodings (appendOwner's bytes), which the heap's timer queue uses to
// order the timers of one timestamp without encoding their owners; nil
// where it does not know one. It knows owners with a zero-size namespace
// (the default timers' and the window operator's: a zero-size type has
// one value, so one encoding), whose order is their framed keys': string
// keys under StringCodec (a uvarint length, then the bytes), and int64,
// int and uint64 keys under Int64Codec, IntCodec and Uint64Codec (a
// length of 8, then 8 big-endian bytes: the order of the keys as
// unsigned numbers, negative ones after the others).
func ownerOrder[K, N comparable](kc Codec[K]) func(a, b timerOwner[K, N]) int {
	if reflect.TypeFor[N]().Size() != 0 {
		return nil
	}
	var f any
	switch any(kc).(type) {
	case stringCodec:
		f = cmpStringOwners[N]
	case int64Codec:
		f = cmpUnsignedOwners[int64, N]
	case intCodec:
		f = cmpUnsignedOwners[int, N]
	case uint64Codec:
		f = cmpUnsignedOwners[uint64, N]
	}
	order, _ := f.(func(a, b timerOwner[K, N]) int)
	return order
}

// cmpStringOwners compares owners of string keys and a zero-size namespace
// as the bytes of their encodings compare: by their keys' frames.
func cmpStringOwners[N comparable](a, b timerOwner[string, N]) int {
	return cmpFramedStrings(a.key, b.key)
}

// cmpUnsignedOwners compares owners of integer keys encoded as 8
// big-endian bytes and a zero-size namespace as the bytes of their
// encodings compare: by their keys' bits as uint64.
func cmpUnsignedOwners[I int64 | int | uint64, N comparable](a, b timerOwner[I, N]) int {
	return cmp.Compare(uint64(a.key), uint64(b.key))
}

// cmpFramedStrings compares a and b as appendFrame's encodings of them
// compare: the uvarint lengths first (which differ in a byte, neither a
// prefix of the other, or are equal), then the bytes.
func cmpFramedStrings(a, b string) int {
	if len(a) < 0x80 && len(b) < 0x80 {
		// One-byte lengths: the length is the byte.
		if len(a) != len(b) {
			return cmp.Compare(len(a), len(b))
		}
		return strings.Compare(a, b)
	}
	var la, lb [binary.MaxVarintLen64]byte
	na := binary.PutUvarint(la[:], uint64(len(a)))
	nb := binary.PutUvarint(lb[:], uint64(len(b)))
	if c := bytes.Compare(la[:na], lb[:nb]); c != 0 {
		return c
	}
	return strings.Compare(a, b)
}

// decodeOwner decodes what appendOwner encoded.
func (t *Timers[K, N]) decodeOwner(b []byte) (timerOwner[K, N], error) {
	var o timerOwner[K, N]
	kb, rest, err := readFrame(b)
	if err != nil {
		return o, err
	}
	nb, _, err := readFrame(rest)
	if err != nil {
		return o, err
	}
	if o.key, err = t.keyCodec.Decode(kb); err != nil {
		return o, fmt.Errorf("key: %w", err)
	}
	if o.ns, err = t.nsCodec.Decode(nb); err != nil {
		return o, fmt.Errorf("namespace: %w", err)
	}
	return o, nil
}

// RegisterEventTimeTimer registers a timer of the current key and ns that
// fires when the watermark reaches ts.
func (t *Timers[K, N]) RegisterEventTimeTimer(ns N, ts int64) {
	t.q[EventTime-1].register(t.host.scope.kg, t.owner(ns), ts)
}

// RegisterProcessingTimeTimer registers a timer of the current key and ns
// that fires when the wall clock reaches ts (epoch ms).
func (t *Timers[K, N]) RegisterProcessingTimeTimer(ns N, ts int64) {
	if t.q[ProcessingTime-1].register(t.host.scope.kg, t.owner(ns), ts) {
		t.host.procChanged = true
	}
}

// DeleteEventTimeTimer deletes the event-time timer of the current key and
// ns at ts, if any.
func (t *Timers[K, N]) DeleteEventTimeTimer(ns N, ts int64) {
	t.q[EventTime-1].remove(t.host.scope.kg, t.owner(ns), ts)
}

// DeleteProcessingTimeTimer deletes the processing-time timer of the
// current key and ns at ts, if any.
func (t *Timers[K, N]) DeleteProcessingTimeTimer(ns N, ts int64) {
	t.q[ProcessingTime-1].remove(t.host.scope.kg, t.owner(ns), ts)
}

// CurrentWatermark is the operator's input watermark.
func (t *Timers[K, N]) CurrentWatermark() int64 { return t.host.watermark }

// CurrentProcessingTime is the wall clock in epoch milliseconds.
func (t *Timers[K, N]) CurrentProcessingTime() int64 { return t.host.clock().UnixMilli() }

// Namespace returns the namespace of the timer firing in ctx (in OnTimer),
// and whether it is one of t's.
func (t *Timers[K, N]) Namespace(ctx *KeyedContext[K]) (N, bool) {
	f := ctx.host.firing
	if f == nil || f.service != t {
		var zero N
		return zero, false
	}
	return f.ns.(N), true
}

// Len is the number of timers registered in the domain, every key. On the
// pebble backend it counts them by a scan (a registration does not read
// whether its timer is new), as Flink's RocksDB timers count theirs.
func (t *Timers[K, N]) Len(d TimeDomain) int { return t.q[d-1].len() }

// fire fires t's timers of domain d at or before upTo.
func (t *Timers[K, N]) fire(d TimeDomain, upTo int64) error {
	q := t.q[d-1]
	for {
		id, kg, ok, err := q.next(upTo)
		if err != nil {
			return fmt.Errorf("timers %q: %w", t.svcName, err)
		}
		if !ok {
			return nil
		}
		t.host.scope.setKey(id.owner.key, kg)
		t.firing = firingTimer{service: t, ns: id.owner.ns, domain: d, ts: id.ts}
		if err := t.host.fire(&t.firing); err != nil {
			return err
		}
	}
}

// nextProcessingTime is t's earliest processing-time timer.
func (t *Timers[K, N]) nextProcessingTime() (int64, bool) {
	return t.q[ProcessingTime-1].peek()
}

// Timers are keyed state (stateSnapshotter): both domains of a key group
// in one blob, under "timers/" + the name. The synchronous part copies the
// live timers' typed ids (timers are not copy-on-write); the asynchronous
// part groups, sorts and encodes them.

func (t *Timers[K, N]) name() string { return "\x00timers/" + t.svcName }

func (t *Timers[K, N]) freeze() frozenState {
	// The asynchronous part encodes with its own encoder: t's buffer
	// belongs to the task's goroutine.
	enc := (&Timers[K, N]{keyCodec: t.keyCodec, nsCodec: t.nsCodec}).appendOwner
	ev := t.q[EventTime-1].snapshot(enc)
	if t.moreEvent != nil {
		ev = t.moreEvent(ev, enc)
	}
	return &frozenTimerService{ev: ev, pr: t.q[ProcessingTime-1].snapshot(enc)}
}

// frozenTimerService is a Timers' snapshot: both domains of a key group
// in one blob (decodeTimers' encoding).
type frozenTimerService struct {
	ev, pr frozenTimers
	buf    []byte
}

func (f *frozenTimerService) keyGroups() ([]int, error) {
	ev, err := f.ev.keyGroups()
	if err != nil {
		return nil, err
	}
	pr, err := f.pr.keyGroups()
	if err != nil {
		return nil, err
	}
	seen := make(map[int]bool, len(ev))
	for _, kg := range ev {
		seen[kg] = true
	}
	for _, kg := range pr {
		if !seen[kg] {
			ev = append(ev, kg)
		}
	}
	return ev, nil
}

func (f *frozenTimerService) appendKeyGroup(dst []byte, kg int) ([]byte, bool, error) {
	var nev, npr int
	var err error
	if f.buf, nev, err = f.ev.appendKeyGroup(f.buf[:0], kg, EventTime); err != nil {
		return dst, false, err
	}
	if f.buf, npr, err = f.pr.appendKeyGroup(f.buf, kg, ProcessingTime); err != nil {
		return dst, false, err
	}
	if nev+npr == 0 {
		return dst, false, nil
	}
	dst = binary.AppendUvarint(dst, uint64(nev+npr))
	return append(dst, f.buf...), true, nil
}

func (t *Timers[K, N]) close() error {
	return errors.Join(t.q[0].close(), t.q[1].close())
}

func (t *Timers[K, N]) restore(kg int, b []byte) error {
	var errAdd error
	err := decodeTimers(b, func(d TimeDomain, owner string, ts int64) {
		if errAdd != nil {
			return
		}
		o, err := t.decodeOwner([]byte(owner))
		if err != nil {
			errAdd = err
			return
		}
		errAdd = t.q[d-1].restored(kg, o, ts)
	})
	if err = errors.Join(err, errAdd); err != nil {
		return fmt.Errorf("timers %q key group %d: %w", t.svcName, kg, err)
	}
	t.host.procChanged = true
	return nil
}

// latestTimer is the latest timestamp of any of t's timers, in either
// time domain; false if there is none.
func (t *Timers[K, N]) latestTimer() (int64, bool) {
	ts, ok := t.q[0].latest()
	if p, pok := t.q[1].latest(); pok && (!ok || p > ts) {
		ts, ok = p, true
	}
	return ts, ok
}

// timerService is the untyped face of a Timers.
type timerService interface {
	fire(d TimeDomain, upTo int64) error
	nextProcessingTime() (int64, bool)
}

// firingTimer is the timer an OnTimer call handles.
type firingTimer struct {
	service any // the *Timers
	ns      any
	domain  TimeDomain
	ts      int64
}

// timerHost is what the timer services of a keyed operator subtask share:
// the key scope, the input watermark, the clock, and how a timer fires.
type timerHost[K comparable] struct {
	scope     *keyScope[K]
	watermark int64
	clock     func() time.Time
	services  []timerService
	// onTimer runs the operator's OnTimer for the timer (set by the
	// operator instance; nil: timers are kept but nothing fires).
	onTimer func(f *firingTimer) error
	firing  *firingTimer
	// procChanged: a processing-time timer was registered or restored, so
	// the task's wake-up may have to come earlier.
	procChanged bool
}

func (h *timerHost[K]) fire(f *firingTimer) error {
	if h.onTimer == nil {
		return nil
	}
	h.firing = f
	defer func() { h.firing = nil }()
	return h.onTimer(f)
}

// advanceWatermark fires every event-time timer at or before wm, service
// by service, each in timestamp order.
func (h *timerHost[K]) advanceWatermark(wm int64) error {
	h.watermark = wm
	for _, s := range h.services {
		if err := s.fire(EventTime, wm); err != nil {
			return err
		}
	}
	return nil
}

// fireProcessingTime fires every processing-time timer at or before now.
func (h *timerHost[K]) fireProcessingTime(now int64) error {
	for _, s := range h.services {
		if err := s.fire(ProcessingTime, now); err != nil {
			return err
		}
	}
	return nil
}

// nextProcessingTime is the earliest processing-time timer of every service.
func (h *timerHost[K]) nextProcessingTime() (int64, bool) {
	next, any := int64(0), false
	for _, s := range h.services {
		if ts, ok := s.nextProcessingTime(); ok && (!any || ts < next) {
			next, any = ts, true
		}
	}
	return next, any
}

// keyTimerService is the TimerService of a KeyedContext: the operator's
// default Timers, without a namespace.
type keyTimerService[K comparable] struct{ t *Timers[K, struct{}] }

func (s keyTimerService[K]) CurrentProcessingTime() int64 { return s.t.CurrentProcessingTime() }
func (s keyTimerService[K]) CurrentWatermark() int64      { return s.t.CurrentWatermark() }
func (s keyTimerService[K]) RegisterEventTimeTimer(ts int64) {
	s.t.RegisterEventTimeTimer(struct{}{}, ts)
}
func (s keyTimerService[K]) RegisterProcessingTimeTimer(ts int64) {
	s.t.RegisterProcessingTimeTimer(struct{}{}, ts)
}
func (s keyTimerService[K]) DeleteEventTimeTimer(ts int64) { s.t.DeleteEventTimeTimer(struct{}{}, ts) }
func (s keyTimerService[K]) DeleteProcessingTimeTimer(ts int64) {
	s.t.DeleteProcessingTimeTimer(struct{}{}, ts)
}

// voidCodec encodes struct{} as nothing: the namespace of the default timers.
type voidCodec struct{}

func (voidCodec) Append(dst []byte, _ struct{}) []byte { return dst }
func (voidCodec) Decode([]byte) (struct{}, error)      { return struct{}{}, nil }
