package runtime

import (
	"encoding/binary"
	"maps"
	"slices"
)

// The state backend seam. The typed keyed states (ValueState, MapState)
// and the timer services (Timers) do not hold their data: they talk to a
// store of one of the kinds below, one store per declared state (or per
// time domain of a timer service), made by the operator subtask's backend.
// A store owns:
//   - the data of its state for the key groups of the subtask, scoped to
//     the current key (keyScope) where the kind says so;
//   - the snapshot of that data in the canonical per-key-group format
//     (stateSnapshotter.freeze: the synchronous part returns the
//     asynchronous encoder) and its restore from that format, so
//     checkpoints and savepoints are the same bytes whatever the backend
//     and restore at any parallelism on any backend.
//
// The heap backend is keyedStore (values, and a map per key for map state)
// and timerQueue (timers, with typed owners); the pebble backend
// (state_pebble.go) keeps every entry and timer in a pebble instance of
// the subtask (a timer's owner encoded in its pebble key).

// valueStore is the current key's value of one value state.
type valueStore[V any] interface {
	get() (V, bool)
	put(V)
	del()
}

// mapStore is the current key's map of one map state, entry by entry: a
// put or remove of one user key does not rewrite the key's other entries
// (on pebble each entry is its own pebble key).
type mapStore[UK comparable, UV any] interface {
	get(uk UK) (UV, bool)
	put(uk UK, uv UV)
	remove(uk UK)
	// each calls fn for each entry until it returns false; fn must not
	// change the map.
	each(fn func(UK, UV) bool)
	len() int
	clear()
}

// timerStore is the timers of one time domain of one timer service, every
// key group of the subtask: at most one timer per (owner, timestamp), the
// owner (of type T: the key and namespace) typed. Ties of a timestamp fire
// in the order of the owners' encodings, the order a restore rebuilds.
type timerStore[T comparable] interface {
	// register adds the timer in key group kg; false if it exists.
	register(kg int, owner T, ts int64) bool
	// remove deletes the timer of key group kg; false if there is none.
	remove(kg int, owner T, ts int64) bool
	// peek is the earliest timer's timestamp.
	peek() (int64, bool)
	// latest is the latest timer's timestamp.
	latest() (int64, bool)
	// next removes and returns the earliest timer at or before upTo, with
	// its key group; false when there is none. The error is a stored
	// owner that does not decode.
	next(upTo int64) (timerID[T], int, bool, error)
	len() int
	// snapshot is the synchronous part of a snapshot: it returns the
	// timers to encode (the asynchronous part), with enc where owners are
	// typed (the store's own encoder's buffers belong to the task's
	// goroutine).
	snapshot(enc ownerEncoder[T]) frozenTimers
	// restored adds a timer read from a snapshot.
	restored(kg int, owner T, ts int64) error
	// close releases what the store holds outside the Go heap.
	close() error
}

// frozenTimers is a timer store's timers at a snapshot, encoded one key
// group at a time (its methods run on the asynchronous part's goroutine).
type frozenTimers interface {
	// keyGroups lists the key groups holding timers, in any order.
	keyGroups() ([]int, error)
	// appendKeyGroup appends kg's timers, ordered by timestamp and then by
	// the owners' encodings, each as appendSortedEntries writes it with
	// domain d; n is how many.
	appendKeyGroup(dst []byte, kg int, d TimeDomain) (_ []byte, n int, _ error)
}

// frozenBlobs is the frozenState of a store that encodes every key group
// in one pass (the pebble stores, from a pebble snapshot): each blob is
// dropped once appended.
type frozenBlobs struct {
	enc   func() (map[int][]byte, error)
	blobs map[int][]byte
}

func (f *frozenBlobs) keyGroups() ([]int, error) {
	if f.blobs == nil {
		blobs, err := f.enc()
		if err != nil {
			return nil, err
		}
		f.blobs, f.enc = blobs, nil
	}
	return slices.Collect(maps.Keys(f.blobs)), nil
}

func (f *frozenBlobs) appendKeyGroup(dst []byte, kg int) ([]byte, bool, error) {
	b, ok := f.blobs[kg]
	if !ok {
		return dst, false, nil
	}
	delete(f.blobs, kg)
	return append(dst, b...), true, nil
}

// heapMap is the heap backend's map store: a Go map per key in a
// keyedStore, copied on write while a snapshot holds it.
type heapMap[K comparable, UK comparable, UV any] struct {
	s *keyedStore[K, map[UK]UV]
}

func (m heapMap[K, UK, UV]) get(uk UK) (UV, bool) {
	mm, _ := m.s.get()
	v, ok := mm[uk]
	return v, ok
}

func (m heapMap[K, UK, UV]) put(uk UK, uv UV) {
	mm, _ := m.s.getForWrite()
	if mm == nil {
		mm = make(map[UK]UV)
	}
	mm[uk] = uv
	m.s.put(mm)
}

func (m heapMap[K, UK, UV]) remove(uk UK) {
	mm, ok := m.s.getForWrite()
	if !ok {
		return
	}
	delete(mm, uk)
	if len(mm) == 0 {
		m.s.del()
	}
}

func (m heapMap[K, UK, UV]) each(fn func(UK, UV) bool) {
	mm, _ := m.s.get()
	for k, v := range mm {
		if !fn(k, v) {
			return
		}
	}
}

func (m heapMap[K, UK, UV]) len() int {
	mm, _ := m.s.get()
	return len(mm)
}

func (m heapMap[K, UK, UV]) clear() { m.s.del() }

// heapTimers is the heap backend's timer store: a timerQueue of typed
// owners.
type heapTimers[T comparable] struct{ q *timerQueue[T] }

func (h heapTimers[T]) register(kg int, owner T, ts int64) bool { return h.q.register(kg, owner, ts) }
func (h heapTimers[T]) remove(_ int, owner T, ts int64) bool    { return h.q.remove(owner, ts) }
func (h heapTimers[T]) peek() (int64, bool)                     { return h.q.peek() }
func (h heapTimers[T]) latest() (int64, bool)                   { return h.q.latest() }
func (h heapTimers[T]) len() int                                { return h.q.len() }
func (h heapTimers[T]) close() error                            { return nil }

func (h heapTimers[T]) next(upTo int64) (timerID[T], int, bool, error) {
	id, kg, ok := h.q.next(upTo)
	return id, kg, ok, nil
}

// snapshot copies the live timers' typed ids (timers are not
// copy-on-write); the asynchronous part groups, sorts and encodes them.
func (h heapTimers[T]) snapshot(enc ownerEncoder[T]) frozenTimers {
	return &frozenHeapTimers[T]{live: h.q.live(), enc: enc}
}

func (h heapTimers[T]) restored(kg int, owner T, ts int64) error {
	h.q.register(kg, owner, ts)
	return nil
}

// frozenHeapTimers is a heapTimers' live timers at a snapshot, grouped by
// key group when first asked, each group sorted as it is encoded.
type frozenHeapTimers[T comparable] struct {
	live   []kgTimer[T]
	enc    ownerEncoder[T]
	groups map[int][]timerID[T]
	sorted timerSorter
}

func (f *frozenHeapTimers[T]) keyGroups() ([]int, error) {
	if f.groups == nil {
		f.groups, f.live = groupTimers(f.live), nil
	}
	return slices.Collect(maps.Keys(f.groups)), nil
}

func (f *frozenHeapTimers[T]) appendKeyGroup(dst []byte, kg int, d TimeDomain) ([]byte, int, error) {
	ids := f.groups[kg]
	delete(f.groups, kg)
	return appendSortedEntries(&f.sorted, dst, f.enc, d, ids), len(ids), nil
}

// encodedTimers is the pebble backend's timer store over typed owners: the
// pebble store keeps each owner encoded (in its pebble key), so owners are
// encoded to register and delete, and decoded to fire.
type encodedTimers[T comparable] struct {
	p   *pebbleTimers
	enc ownerEncoder[T]
	dec func([]byte) (T, error)
	buf []byte
}

func newEncodedTimers[T comparable](p *pebbleTimers, enc ownerEncoder[T], dec func([]byte) (T, error)) *encodedTimers[T] {
	return &encodedTimers[T]{p: p, enc: enc, dec: dec}
}

func (e *encodedTimers[T]) owner(o T) string {
	e.buf = e.enc(e.buf[:0], o)
	return string(e.buf)
}

func (e *encodedTimers[T]) register(kg int, owner T, ts int64) bool {
	return e.p.register(kg, e.owner(owner), ts)
}

func (e *encodedTimers[T]) remove(kg int, owner T, ts int64) bool {
	return e.p.remove(kg, e.owner(owner), ts)
}

func (e *encodedTimers[T]) peek() (int64, bool) {
	id, ok := e.p.peek()
	return id.ts, ok
}

func (e *encodedTimers[T]) latest() (int64, bool) { return e.p.latest() }

func (e *encodedTimers[T]) next(upTo int64) (timerID[T], int, bool, error) {
	id, kg, ok := e.p.next(upTo)
	if !ok {
		return timerID[T]{}, 0, false, nil
	}
	o, err := e.dec([]byte(id.owner))
	if err != nil {
		return timerID[T]{}, 0, false, err
	}
	return timerID[T]{ts: id.ts, owner: o}, kg, true, nil
}

func (e *encodedTimers[T]) len() int     { return e.p.len() }
func (e *encodedTimers[T]) close() error { return e.p.close() }

func (e *encodedTimers[T]) snapshot(ownerEncoder[T]) frozenTimers {
	return &frozenPebbleTimers{enc: e.p.snapshot()}
}

func (e *encodedTimers[T]) restored(kg int, owner T, ts int64) error {
	return e.p.restored(kg, e.owner(owner), ts)
}

// frozenPebbleTimers is a pebbleTimers' snapshot: its timers, read from
// the pebble snapshot when first asked, with their owners as stored.
type frozenPebbleTimers struct {
	enc    func() (map[int][]pebbleTimerID, error)
	groups map[int][]pebbleTimerID
}

func (f *frozenPebbleTimers) keyGroups() ([]int, error) {
	if f.groups == nil {
		groups, err := f.enc()
		if err != nil {
			return nil, err
		}
		f.groups, f.enc = groups, nil
	}
	return slices.Collect(maps.Keys(f.groups)), nil
}

func (f *frozenPebbleTimers) appendKeyGroup(dst []byte, kg int, d TimeDomain) ([]byte, int, error) {
	ids := f.groups[kg]
	delete(f.groups, kg)
	for _, id := range ids {
		dst = append(dst, byte(d))
		dst = binary.AppendVarint(dst, id.ts)
		dst = appendFrame(dst, []byte(id.owner))
	}
	return dst, len(ids), nil
}
