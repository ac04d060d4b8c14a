package runtime

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"
)

// State time-to-live (Flink's StateTtlConfig). A state declared WithTTL
// stores, next to each value (each entry of a map state, each element of a
// list state), the processing time it was last written (or read, with
// TTLOnReadAndWrite), and never returns a value older than the TTL. Expired
// values are dropped:
//   - when they are read (the read returns nothing);
//   - incrementally on the heap backend: every access to the state checks
//     a few more entries of the subtask (CleanupPerAccess), in turn, and
//     drops the expired ones, so state that is never read again is freed
//     too;
//   - from every snapshot: an expired value is not written.
//
// Time is the processing time of the operator's timer service (the wall
// clock, or the OperatorHarness's clock). A TTL state is stored under a
// name that says so: declaring a state restored without TTL with it (or
// the reverse) is refused, as Flink refuses it.

// ttlKindSuffix marks the stored kind of a state with TTL.
const ttlKindSuffix = "+ttl"

// TTLUpdate says which accesses refresh a value's time-to-live.
type TTLUpdate int

const (
	// TTLOnCreateAndWrite refreshes it when the value is written (Flink's
	// OnCreateAndWrite, the default).
	TTLOnCreateAndWrite TTLUpdate = iota
	// TTLOnReadAndWrite refreshes it when the value is read too (Flink's
	// OnReadAndWrite).
	TTLOnReadAndWrite
)

// StateTTLConfig is the time-to-live of a state (Flink's StateTtlConfig,
// with its NeverReturnExpired visibility).
type StateTTLConfig struct {
	// TTL is how long a value lives after its last refresh; it must be
	// positive.
	TTL time.Duration
	// Update says which accesses refresh it.
	Update TTLUpdate
	// CleanupPerAccess is how many entries the heap backend checks for
	// expiry at every access to the state (0: 5, Flink's default; negative:
	// no incremental cleanup, expired values are then dropped only when
	// read and from snapshots).
	CleanupPerAccess int
}

// StateOpt is an option of a keyed state's declaration.
type StateOpt interface{ apply(*stateCfg) }

type stateCfg struct {
	ttl *StateTTLConfig
}

type stateOpt func(*stateCfg)

func (o stateOpt) apply(c *stateCfg) { o(c) }

// WithTTL gives the state a time-to-live.
func WithTTL(c StateTTLConfig) StateOpt {
	return stateOpt(func(s *stateCfg) { s.ttl = &c })
}

func stateCfgOf(opts []StateOpt) stateCfg {
	var c stateCfg
	for _, o := range opts {
		o.apply(&c)
	}
	return c
}

// ttlValue is a value with the processing time (epoch ms) of its last
// refresh.
type ttlValue[V any] struct {
	v  V
	ts int64
}

// ttlCodec encodes a ttlValue as its time (varint) and the value.
type ttlCodec[V any] struct{ c Codec[V] }

func (c ttlCodec[V]) Append(dst []byte, v ttlValue[V]) []byte {
	return c.c.Append(binary.AppendVarint(dst, v.ts), v.v)
}

func (c ttlCodec[V]) Decode(b []byte) (ttlValue[V], error) {
	ts, n := binary.Varint(b)
	if n <= 0 {
		return ttlValue[V]{}, fmt.Errorf("%w: ttl timestamp", ErrDecode)
	}
	v, err := c.c.Decode(b[n:])
	return ttlValue[V]{v: v, ts: ts}, err
}

// ttlClock is the expiry arithmetic of one TTL state.
type ttlClock struct {
	ttl    int64 // ms
	onRead bool
	clock  func() time.Time
	per    int // entries checked per access; 0: none
}

func newTTLClock[K comparable](r *StateRegistry[K], name string, c StateTTLConfig) (ttlClock, error) {
	if c.TTL < time.Millisecond {
		return ttlClock{}, Unrecoverable(fmt.Errorf("%w: state %q: TTL %v must be at least 1ms", ErrInvalidOption, name, c.TTL))
	}
	per := c.CleanupPerAccess
	switch {
	case per == 0:
		per = 5
	case per < 0:
		per = 0
	}
	h := r.b.timers
	return ttlClock{ttl: c.TTL.Milliseconds(), onRead: c.Update == TTLOnReadAndWrite, per: per,
		clock: func() time.Time { return h.clock() }}, nil
}

func (t ttlClock) now() int64 { return t.clock().UnixMilli() }

func (t ttlClock) expired(ts, now int64) bool { return now-ts >= t.ttl }

// heapCleaner drops expired entries of a heap store a few at a time.
type heapCleaner[K comparable, V any] struct {
	s      *keyedStore[K, V]
	kg, i  int // the cursor: next entry to check
	per    int
	now    func() int64
	expire func(v V, now int64) (V, bool, bool) // trimmed value, changed, keep
}

// setupHeapTTL makes a heap store's snapshots skip expired values and
// returns its incremental cleanup (nil if s is not a heap store).
func setupHeapTTL[K comparable, V any](store any, t ttlClock, expire func(v V, now int64) (V, bool, bool)) func() {
	s, ok := store.(*keyedStore[K, V])
	if !ok {
		return nil
	}
	s.filter = func() func(V) (V, bool) {
		now := t.now()
		return func(v V) (V, bool) {
			v, _, keep := expire(v, now)
			return v, keep
		}
	}
	if t.per == 0 {
		return nil
	}
	c := &heapCleaner[K, V]{s: s, per: t.per, now: t.now, expire: expire}
	return c.run
}

// run checks the next per entries of the store.
func (c *heapCleaner[K, V]) run() {
	s := c.s
	now := c.now()
	empty := 0 // key groups passed without an entry, to stop on an empty store
	for checked := 0; checked < c.per; {
		if c.kg >= len(s.groups) {
			c.kg, c.i = 0, 0
		}
		g := s.groups[c.kg]
		if g == nil || c.i >= len(g.ents) {
			if c.i == 0 {
				if empty++; empty > len(s.groups) {
					return
				}
			}
			c.kg, c.i = c.kg+1, 0
			continue
		}
		empty = 0
		checked++
		v, changed, keep := c.expire(g.ents[c.i].val, now)
		switch {
		case !keep:
			s.unshare(g)
			last := len(g.ents) - 1
			key := g.ents[c.i].key
			if c.i != last {
				g.ents[c.i] = g.ents[last]
				s.index(g.ents[c.i].key, c.kg, int32(c.i))
			}
			if s.clone != nil { // the moved value's copy-on-write mark moves too
				g.setValShared(int32(c.i), g.valShared(int32(last)))
				g.setValShared(int32(last), false)
			}
			g.ents[last] = stateEntry[K, V]{}
			g.ents = g.ents[:last]
			delete(s.idx, key)
			s.atGen = 0 // positions moved
		case changed:
			s.unshare(g)
			g.ents[c.i].val = v // a new value (expire does not change v in place)
			if s.clone != nil {
				g.setValShared(int32(c.i), false)
			}
			c.i++
		default:
			c.i++
		}
	}
}

// ttlValueStore is a value store with TTL over a store of ttlValues.
type ttlValueStore[V any] struct {
	in      valueStore[ttlValue[V]]
	t       ttlClock
	cleanup func()
}

func (s *ttlValueStore[V]) clean() {
	if s.cleanup != nil {
		s.cleanup()
	}
}

func (s *ttlValueStore[V]) get() (V, bool) {
	s.clean()
	x, ok := s.in.get()
	var zero V
	if !ok {
		return zero, false
	}
	now := s.t.now()
	if s.t.expired(x.ts, now) {
		s.in.del()
		return zero, false
	}
	if s.t.onRead {
		s.in.put(ttlValue[V]{v: x.v, ts: now})
	}
	return x.v, true
}

func (s *ttlValueStore[V]) put(v V) {
	s.clean()
	s.in.put(ttlValue[V]{v: v, ts: s.t.now()})
}

func (s *ttlValueStore[V]) del() { s.in.del() }

// newTTLValueState declares the value state with TTL behind a value
// (kind ""), reducing or aggregating state.
func newTTLValueState[T any, K comparable](r *StateRegistry[K], kind, name string, c Codec[T], cfg StateTTLConfig) (*ValueState[T], error) {
	t, err := newTTLClock(r, name, cfg)
	if err != nil {
		return nil, err
	}
	if kind == "" {
		kind = "value"
	}
	in, err := newValueState[ttlValue[T]](r, storedStateName(kind+ttlKindSuffix, name), Codec[ttlValue[T]](ttlCodec[T]{c}))
	if err != nil {
		return nil, err
	}
	s := &ttlValueStore[T]{in: in.s, t: t}
	s.cleanup = setupHeapTTL[K](in.s, t, func(v ttlValue[T], now int64) (ttlValue[T], bool, bool) {
		return v, false, !t.expired(v.ts, now)
	})
	if s.cleanup == nil {
		s.cleanup = setupPebbleTTL(in.s, t)
	}
	return &ValueState[T]{s: s}, nil
}

// ttlMapStore is a map store with TTL per entry.
type ttlMapStore[UK comparable, UV any] struct {
	in      mapStore[UK, ttlValue[UV]]
	t       ttlClock
	cleanup func()
}

func (m *ttlMapStore[UK, UV]) clean() {
	if m.cleanup != nil {
		m.cleanup()
	}
}

func (m *ttlMapStore[UK, UV]) get(uk UK) (UV, bool) {
	m.clean()
	x, ok := m.in.get(uk)
	var zero UV
	if !ok {
		return zero, false
	}
	now := m.t.now()
	if m.t.expired(x.ts, now) {
		m.in.remove(uk)
		return zero, false
	}
	if m.t.onRead {
		m.in.put(uk, ttlValue[UV]{v: x.v, ts: now})
	}
	return x.v, true
}

func (m *ttlMapStore[UK, UV]) put(uk UK, uv UV) {
	m.clean()
	m.in.put(uk, ttlValue[UV]{v: uv, ts: m.t.now()})
}

func (m *ttlMapStore[UK, UV]) remove(uk UK) { m.in.remove(uk) }

// each skips expired entries, and drops them after the iteration; with
// TTLOnReadAndWrite it refreshes the entries fn saw.
func (m *ttlMapStore[UK, UV]) each(fn func(UK, UV) bool) {
	m.clean()
	now := m.t.now()
	var expired, seen []UK
	var seenV []UV
	m.in.each(func(k UK, x ttlValue[UV]) bool {
		if m.t.expired(x.ts, now) {
			expired = append(expired, k)
			return true
		}
		if m.t.onRead {
			seen, seenV = append(seen, k), append(seenV, x.v)
		}
		return fn(k, x.v)
	})
	for _, k := range expired {
		m.in.remove(k)
	}
	for i, k := range seen {
		m.in.put(k, ttlValue[UV]{v: seenV[i], ts: now})
	}
}

func (m *ttlMapStore[UK, UV]) len() int {
	n := 0
	m.each(func(UK, UV) bool { n++; return true })
	return n
}

func (m *ttlMapStore[UK, UV]) clear() { m.in.clear() }

// newTTLMapState declares a map state with TTL per entry.
func newTTLMapState[UK comparable, UV any, K comparable](r *StateRegistry[K], name string, kc Codec[UK], vc Codec[UV], cfg StateTTLConfig) (*MapState[UK, UV], error) {
	t, err := newTTLClock(r, name, cfg)
	if err != nil {
		return nil, err
	}
	in, err := newMapState[UK, ttlValue[UV]](r, storedStateName("map"+ttlKindSuffix, name), kc, Codec[ttlValue[UV]](ttlCodec[UV]{vc}))
	if err != nil {
		return nil, err
	}
	s := &ttlMapStore[UK, UV]{in: in.s, t: t}
	if hm, ok := in.s.(heapMap[K, UK, ttlValue[UV]]); ok {
		s.cleanup = setupHeapTTL[K](hm.s, t, func(m map[UK]ttlValue[UV], now int64) (map[UK]ttlValue[UV], bool, bool) {
			n := 0
			for _, x := range m {
				if !t.expired(x.ts, now) {
					n++
				}
			}
			if n == len(m) {
				return m, false, n > 0
			}
			if n == 0 {
				return nil, true, false
			}
			live := make(map[UK]ttlValue[UV], n)
			for k, x := range m {
				if !t.expired(x.ts, now) {
					live[k] = x
				}
			}
			return live, true, true
		})
	} else {
		s.cleanup = setupPebbleTTL(in.s, t)
	}
	return &MapState[UK, UV]{s: s}, nil
}

// ttlListStore is a list store with TTL per element.
type ttlListStore[T any] struct {
	in      listStore[ttlValue[T]]
	t       ttlClock
	cleanup func()
}

func (l *ttlListStore[T]) clean() {
	if l.cleanup != nil {
		l.cleanup()
	}
}

// each skips expired elements and writes the list back without them
// (refreshed, with TTLOnReadAndWrite) when it changed.
func (l *ttlListStore[T]) each(fn func(T) bool) {
	l.clean()
	now := l.t.now()
	var all []ttlValue[T]
	var expired bool
	l.in.each(func(x ttlValue[T]) bool {
		if l.t.expired(x.ts, now) {
			expired = true
			return true
		}
		all = append(all, x)
		return true
	})
	for _, x := range all {
		if !fn(x.v) {
			break
		}
	}
	if l.t.onRead {
		for i := range all {
			all[i].ts = now
		}
	}
	if expired || (l.t.onRead && len(all) > 0) {
		l.in.update(all)
	}
}

func (l *ttlListStore[T]) add(vs ...T) {
	l.clean()
	now := l.t.now()
	xs := make([]ttlValue[T], len(vs))
	for i, v := range vs {
		xs[i] = ttlValue[T]{v: v, ts: now}
	}
	l.in.add(xs...)
}

func (l *ttlListStore[T]) update(vs []T) {
	l.clean()
	now := l.t.now()
	xs := make([]ttlValue[T], len(vs))
	for i, v := range vs {
		xs[i] = ttlValue[T]{v: v, ts: now}
	}
	l.in.update(xs)
}

func (l *ttlListStore[T]) clear() { l.in.clear() }

// newTTLListState declares a list state with TTL per element.
func newTTLListState[T any, K comparable](r *StateRegistry[K], name string, c Codec[T], cfg StateTTLConfig) (*ListState[T], error) {
	t, err := newTTLClock(r, name, cfg)
	if err != nil {
		return nil, err
	}
	in, heap, err := newListStore[ttlValue[T]](r, storedStateName(kindList+ttlKindSuffix, name), Codec[ttlValue[T]](ttlCodec[T]{c}))
	if err != nil {
		return nil, err
	}
	s := &ttlListStore[T]{in: in, t: t}
	if heap == nil {
		s.cleanup = setupPebbleTTL(in, t)
		return &ListState[T]{s: s}, nil
	}
	s.cleanup = setupHeapTTL[K](heap, t, func(l []ttlValue[T], now int64) ([]ttlValue[T], bool, bool) {
		n := 0
		for _, x := range l {
			if !t.expired(x.ts, now) {
				n++
			}
		}
		if n == len(l) {
			return l, false, n > 0
		}
		if n == 0 {
			return nil, true, false
		}
		live := make([]ttlValue[T], 0, n)
		for _, x := range l {
			if !t.expired(x.ts, now) {
				live = append(live, x)
			}
		}
		return live, true, true
	})
	return &ListState[T]{s: s}, nil
}

// MarshalJSON shows a value with TTL as its value (in a state dump).
func (x ttlValue[V]) MarshalJSON() ([]byte, error) { return json.Marshal(x.v) }
