package runtime

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
)

// timerID names one timer of a queue: its timestamp and its owner (the key
// and namespace, typed). A queue holds at most one timer per id.
type timerID[T comparable] struct {
	ts    int64
	owner T
}

// ownerEncoder appends the encoding of a timer's owner to dst: the bytes
// snapshots hold, whose order breaks ties between timers of one timestamp.
type ownerEncoder[T comparable] func(dst []byte, owner T) []byte

// timerQueue is the timers of one time domain of one timer service of a
// keyed operator subtask, as a pure state machine: register, delete and
// next (the firing of every timer at or before a time, earliest first,
// ties by the owner's encoding so the order is the same after a restore),
// and each timer's key group for snapshots by key group. It holds no clock
// and calls nothing.
//
// Its memory is a bucket per timestamp (its one timer inline, or a set of
// typed owners, each with its key group, once it has two: a timer at a
// timestamp of its own costs no map) and a min-heap of the buckets'
// timestamps: the aligned
// windows of a window operator end together for every key, so one heap
// entry stands for all the keys' timers of a window end, and no owner is
// encoded to register, delete or order timers. When a timestamp comes due,
// its bucket is taken out whole as the batch, sorted by owner (the
// owners' comparison where it is known, ownerOrder, else their
// encodings), and its timers fire from the batch in that order; the
// bucket's set is then cleared for reuse, not emptied timer by timer. A
// timer registered at the batch's timestamp while it fires joins the
// batch in order (one registered earlier fires first); one deleted then
// leaves it.
//
// A registration hashes the timer's owner once (an insert that tells
// whether it was there), a deletion once, a firing never. A bucket emptied
// by deletions goes at once; its heap entry stays until it surfaces or
// until such stale entries outnumber the buckets (compactHeap).
type timerQueue[T comparable] struct {
	buckets map[int64]tsBucket[T] // live timers by timestamp (the batch's not)
	heap    []int64               // the buckets' timestamps, and stale ones (len(heap)-len(buckets))
	n       int                   // live timers
	enc     ownerEncoder[T]
	// cmp, when set, orders owners as the bytes of their encodings
	// compare, without encoding them (ownerOrder): ties of a timestamp
	// are then sorted on the owners themselves.
	cmp func(a, b T) int

	// last is the set of the bucket of timestamp lastTS, the last
	// registered to (nil: none, or a bucket of one timer): a window
	// operator registers a run of keys' timers at one window end.
	last   map[T]int32
	lastTS int64
	spare  map[T]int32 // a fired bucket's set, cleared, for the next bucket

	// batch[cur:] are the live timers of timestamp batchTS due to fire,
	// in order.
	batch   []kgTimer[T]
	cur     int
	batchTS int64
	scratch []byte // encodings while ordering a batch

	probes int // operations on the buckets' sets (what the tests count)
}

func newTimerQueue[T comparable](enc ownerEncoder[T]) *timerQueue[T] {
	return &timerQueue[T]{buckets: map[int64]tsBucket[T]{}, enc: enc}
}

// tsBucket is the live timers of one timestamp: one (owner, kg) while set
// is nil, else set (owner -> key group), which holds them all.
type tsBucket[T comparable] struct {
	owner T
	kg    int32
	set   map[T]int32
}

// newSet returns an empty set for a bucket (the spare one if there is).
func (q *timerQueue[T]) newSet() map[T]int32 {
	m := q.spare
	if m == nil {
		m = map[T]int32{}
	}
	q.spare = nil
	return m
}

// firing reports whether a batch is being fired.
func (q *timerQueue[T]) firing() bool { return q.cur < len(q.batch) }

// register adds the timer (ts, owner) in key group kg; false if it exists.
func (q *timerQueue[T]) register(kg int, owner T, ts int64) bool {
	q.probes++
	if q.firing() && ts == q.batchTS {
		i, ok := q.findInBatch(owner)
		if ok {
			return false
		}
		q.batch = slices.Insert(q.batch, q.cur+i, kgTimer[T]{id: timerID[T]{ts: ts, owner: owner}, kg: int32(kg)})
		q.n++
		return true
	}
	set := q.last
	if set == nil || q.lastTS != ts {
		b, ok := q.buckets[ts]
		switch {
		case !ok:
			q.buckets[ts] = tsBucket[T]{owner: owner, kg: int32(kg)}
			q.push(ts)
			q.n++
			return true
		case b.set == nil:
			if b.owner == owner {
				return false
			}
			b.set = q.newSet()
			b.set[b.owner] = b.kg
			b.owner = *new(T)
			q.buckets[ts] = b
		}
		set = b.set
		q.last, q.lastTS = set, ts
	}
	n := len(set)
	set[owner] = int32(kg) // one probe: inserted, or there already (an owner's key group is its key's)
	if len(set) == n {
		return false
	}
	q.n++
	return true
}

// dropBucket takes the bucket of ts out of buckets (its heap entry stays,
// stale if popped later) and returns it.
func (q *timerQueue[T]) dropBucket(ts int64) tsBucket[T] {
	b := q.buckets[ts]
	delete(q.buckets, ts)
	if q.lastTS == ts {
		q.last = nil
	}
	return b
}

// findInBatch returns owner's position in the batch's rest (sorted by
// owner), or where it goes.
func (q *timerQueue[T]) findInBatch(owner T) (int, bool) {
	rest := q.batch[q.cur:]
	if q.cmp != nil {
		return slices.BinarySearchFunc(rest, owner, func(x kgTimer[T], o T) int { return q.cmp(x.id.owner, o) })
	}
	q.scratch = q.enc(q.scratch[:0], owner)
	n := len(q.scratch)
	return slices.BinarySearchFunc(rest, owner, func(x kgTimer[T], _ T) int {
		q.scratch = q.enc(q.scratch[:n], x.id.owner)
		return bytes.Compare(q.scratch[n:], q.scratch[:n])
	})
}

// remove deletes the timer (ts, owner); false if there is none.
func (q *timerQueue[T]) remove(owner T, ts int64) bool {
	q.probes++
	if q.firing() && ts == q.batchTS {
		i, ok := q.findInBatch(owner)
		if !ok {
			return false // none, or fired already
		}
		q.batch = slices.Delete(q.batch, q.cur+i, q.cur+i+1)
		q.n--
		return true
	}
	b, ok := q.buckets[ts]
	switch {
	case !ok:
		return false
	case b.set == nil:
		if b.owner != owner {
			return false
		}
	default:
		n := len(b.set)
		delete(b.set, owner)
		if len(b.set) == n {
			return false
		}
		if len(b.set) > 0 {
			q.n--
			return true
		}
		q.spare = b.set
	}
	q.n--
	q.dropBucket(ts)
	q.compactHeap()
	return true
}

// compactHeap drops the heap's stale entries (timestamps without a
// bucket) once they outnumber the buckets, so that timers registered and
// deleted at ever new timestamps do not grow it.
func (q *timerQueue[T]) compactHeap() {
	if stale := len(q.heap) - len(q.buckets); stale <= 64 || stale <= len(q.buckets) {
		return
	}
	q.heap = q.heap[:0]
	for ts := range q.buckets {
		q.heap = append(q.heap, ts)
	}
	for i := len(q.heap)/2 - 1; i >= 0; i-- {
		q.down(i)
	}
}

func (q *timerQueue[T]) push(ts int64) {
	q.heap = append(q.heap, ts)
	q.up(len(q.heap) - 1)
}

func (q *timerQueue[T]) pop() {
	h := q.heap
	n := len(h) - 1
	h[0] = h[n]
	q.heap = h[:n]
	if n > 0 {
		q.down(0)
	}
}

func (q *timerQueue[T]) up(i int) {
	h := q.heap
	x := h[i]
	for i > 0 {
		p := (i - 1) / 2
		if h[p] <= x {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = x
}

func (q *timerQueue[T]) down(i int) {
	h := q.heap
	n := len(h)
	x := h[i]
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if r := c + 1; r < n && h[r] < h[c] {
			c = r
		}
		if x <= h[c] {
			break
		}
		h[i] = h[c]
		i = c
	}
	h[i] = x
}

// heapMin drops the heap's stale head entries and returns the earliest
// bucket's timestamp.
func (q *timerQueue[T]) heapMin() (int64, bool) {
	for len(q.heap) > 0 {
		ts := q.heap[0]
		if _, ok := q.buckets[ts]; ok {
			return ts, true
		}
		q.pop()
	}
	return 0, false
}

func (q *timerQueue[T]) endBatch() {
	clear(q.batch)
	q.batch, q.cur = q.batch[:0], 0
}

// peek returns the earliest live timer's timestamp.
func (q *timerQueue[T]) peek() (int64, bool) {
	ts, ok := q.heapMin()
	if q.firing() && (!ok || q.batchTS < ts) {
		return q.batchTS, true
	}
	return ts, ok
}

// latest is the latest live timer's timestamp: a pass over the timestamps
// (a restore asks it once).
func (q *timerQueue[T]) latest() (int64, bool) {
	ts, ok := int64(0), false
	for t := range q.buckets {
		if !ok || t > ts {
			ts, ok = t, true
		}
	}
	if q.firing() && (!ok || q.batchTS > ts) {
		ts, ok = q.batchTS, true
	}
	return ts, ok
}

// next removes and returns the earliest timer at or before upTo, with its
// key group; false when there is none. Call it in a loop: a timer
// registered by a firing one (at or before upTo) fires in the same loop.
func (q *timerQueue[T]) next(upTo int64) (timerID[T], int, bool) {
	for {
		if q.firing() {
			if len(q.heap) > 0 && q.heap[0] < q.batchTS {
				if ts, ok := q.heapMin(); ok && ts < q.batchTS {
					// Registered while the batch fired, earlier than it:
					// it fires first, the batch's rest goes back to a
					// bucket.
					set := q.newSet()
					for _, e := range q.batch[q.cur:] {
						set[e.id.owner] = e.kg
					}
					q.buckets[q.batchTS] = tsBucket[T]{set: set}
					q.push(q.batchTS)
					q.endBatch()
					continue
				}
			}
			if q.batchTS > upTo {
				return timerID[T]{}, 0, false
			}
			e := q.batch[q.cur]
			q.batch[q.cur] = kgTimer[T]{}
			q.cur++
			q.n--
			return e.id, int(e.kg), true
		}
		if len(q.batch) > 0 {
			q.endBatch()
		}
		ts, ok := q.heapMin()
		if !ok || ts > upTo {
			return timerID[T]{}, 0, false
		}
		q.pop()
		b := q.dropBucket(ts)
		if b.set == nil {
			q.batch = append(q.batch, kgTimer[T]{id: timerID[T]{ts: ts, owner: b.owner}, kg: b.kg})
		} else {
			for owner, kg := range b.set {
				q.batch = append(q.batch, kgTimer[T]{id: timerID[T]{ts: ts, owner: owner}, kg: kg})
			}
			clear(b.set)
			q.spare = b.set
		}
		q.batchTS = ts
		q.batch = q.sortByOwner(q.batch)
	}
}

// sortByOwner orders es (of one timestamp) by their owners' encodings.
func (q *timerQueue[T]) sortByOwner(es []kgTimer[T]) []kgTimer[T] {
	if len(es) < 2 {
		return es
	}
	if q.cmp != nil {
		slices.SortFunc(es, func(x, y kgTimer[T]) int { return q.cmp(x.id.owner, y.id.owner) })
		return es
	}
	type keyed struct {
		off, end int
		e        kgTimer[T]
	}
	ks := make([]keyed, len(es))
	b := q.scratch[:0]
	for i, e := range es {
		off := len(b)
		b = q.enc(b, e.id.owner)
		ks[i] = keyed{off, len(b), e}
	}
	slices.SortFunc(ks, func(x, y keyed) int { return bytes.Compare(b[x.off:x.end], b[y.off:y.end]) })
	for i, k := range ks {
		es[i] = k.e
	}
	q.scratch = b[:0]
	return es
}

// len is the number of live timers.
func (q *timerQueue[T]) len() int { return q.n }

// kgTimer is a timer with its key group: an entry of the queue's heap and
// batch, and what a snapshot copies.
type kgTimer[T comparable] struct {
	id timerID[T]
	kg int32
}

// live copies the live timers (the synchronous part of a snapshot: typed
// ids, nothing encoded).
func (q *timerQueue[T]) live() []kgTimer[T] {
	out := make([]kgTimer[T], 0, q.n)
	out = append(out, q.batch[q.cur:]...)
	for ts, b := range q.buckets {
		if b.set == nil {
			out = append(out, kgTimer[T]{id: timerID[T]{ts: ts, owner: b.owner}, kg: b.kg})
			continue
		}
		for owner, kg := range b.set {
			out = append(out, kgTimer[T]{id: timerID[T]{ts: ts, owner: owner}, kg: kg})
		}
	}
	return out
}

// groupTimers groups timers by key group (each group in no order:
// timerSorter orders one when it is encoded).
func groupTimers[T comparable](ts []kgTimer[T]) map[int][]timerID[T] {
	counts := map[int32]int{}
	for _, t := range ts {
		counts[t.kg]++
	}
	out := make(map[int][]timerID[T], len(counts))
	for kg, n := range counts {
		out[int(kg)] = make([]timerID[T], 0, n)
	}
	for _, t := range ts {
		out[int(t.kg)] = append(out[int(t.kg)], t.id)
	}
	return out
}

// timerSorter encodes the timers of one key group in a snapshot's order,
// by timestamp and then by the owner's encoding, encoding each owner once
// (not at each comparison, nor again to write it). Its buffers are reused
// from one key group to the next.
type timerSorter struct {
	ks []timerSortKey
	ob []byte
}

// timerSortKey is one timer being sorted: its timestamp, its owner's
// encoding ob[off:end] of the timerSorter, and the encoding's first 8
// bytes (big endian, zero-padded), which decide most comparisons.
type timerSortKey struct {
	ts       int64
	prefix   uint64
	off, end int
}

// appendSortedEntries appends ids' entries of domain d in order: per
// timer d, the timestamp (varint) and the owner (framed).
func appendSortedEntries[T comparable](s *timerSorter, dst []byte, enc ownerEncoder[T], d TimeDomain, ids []timerID[T]) []byte {
	s.ks, s.ob = s.ks[:0], s.ob[:0]
	for _, id := range ids {
		off := len(s.ob)
		s.ob = enc(s.ob, id.owner)
		var p [8]byte
		copy(p[:], s.ob[off:])
		s.ks = append(s.ks, timerSortKey{ts: id.ts, prefix: binary.BigEndian.Uint64(p[:]), off: off, end: len(s.ob)})
	}
	ob := s.ob
	slices.SortFunc(s.ks, func(x, y timerSortKey) int {
		if x.ts != y.ts {
			return cmpInt64(x.ts, y.ts)
		}
		if x.prefix != y.prefix {
			if x.prefix < y.prefix {
				return -1
			}
			return 1
		}
		return bytes.Compare(ob[x.off:x.end], ob[y.off:y.end])
	})
	for _, k := range s.ks {
		dst = append(dst, byte(d))
		dst = binary.AppendVarint(dst, k.ts)
		dst = appendFrame(dst, ob[k.off:k.end])
	}
	return dst
}

// A key group's timers of both domains are encoded in one blob: a count
// (uvarint), then per timer its domain, timestamp (varint) and owner
// (framed); appendSortedEntries appends the timers of one domain after
// the count.

// decodeTimers calls add for every timer of a key group's timers blob.
func decodeTimers(b []byte, add func(d TimeDomain, owner string, ts int64)) error {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return fmt.Errorf("%w: timer count", ErrDecode)
	}
	b = b[k:]
	for i := uint64(0); i < n; i++ {
		if len(b) == 0 {
			return fmt.Errorf("%w: timer %d", ErrDecode, i)
		}
		d := TimeDomain(b[0])
		if d != EventTime && d != ProcessingTime {
			return fmt.Errorf("%w: timer domain %d", ErrDecode, d)
		}
		ts, k := binary.Varint(b[1:])
		if k <= 0 {
			return fmt.Errorf("%w: timer timestamp", ErrDecode)
		}
		owner, rest, err := readFrame(b[1+k:])
		if err != nil {
			return err
		}
		add(d, string(owner), ts)
		b = rest
	}
	if len(b) != 0 {
		return fmt.Errorf("%w: %d bytes after the timers", ErrDecode, len(b))
	}
	return nil
}
