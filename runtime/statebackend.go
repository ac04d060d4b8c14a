package runtime

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
// and timerQueue (timers); the pebble backend (state_pebble.go) keeps
// every entry and timer in a pebble instance of the subtask.

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
// owner being the encoded key and namespace.
type timerStore interface {
	// register adds the timer in key group kg; false if it exists.
	register(kg int, owner string, ts int64) bool
	// remove deletes the timer of key group kg; false if there is none.
	remove(kg int, owner string, ts int64) bool
	// peek is the earliest timer.
	peek() (timerID, bool)
	// next removes and returns the earliest timer at or before upTo, with
	// its key group; false when there is none.
	next(upTo int64) (timerID, int, bool)
	len() int
	// snapshot is the synchronous part of a snapshot: it returns the
	// asynchronous part, which lists the timers by key group, each group
	// sorted (timerID.less).
	snapshot() func() (map[int][]timerID, error)
	// restored adds a timer read from a snapshot.
	restored(kg int, owner string, ts int64) error
	// close releases what the store holds outside the Go heap.
	close() error
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

// heapTimers is the heap backend's timer store: a timerQueue.
type heapTimers struct{ q *timerQueue }

func (h heapTimers) register(kg int, owner string, ts int64) bool { return h.q.register(kg, owner, ts) }
func (h heapTimers) remove(_ int, owner string, ts int64) bool    { return h.q.remove(owner, ts) }
func (h heapTimers) peek() (timerID, bool)                        { return h.q.peek() }
func (h heapTimers) next(upTo int64) (timerID, int, bool)         { return h.q.next(upTo) }
func (h heapTimers) len() int                                     { return h.q.len() }
func (h heapTimers) close() error                                 { return nil }

func (h heapTimers) snapshot() func() (map[int][]timerID, error) {
	ids := h.q.byKeyGroup()
	return func() (map[int][]timerID, error) { return ids, nil }
}

func (h heapTimers) restored(kg int, owner string, ts int64) error {
	h.q.register(kg, owner, ts)
	return nil
}
