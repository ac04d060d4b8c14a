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
// Its memory is a set of typed ids (owner and timestamp) and a min-heap of
// the same ids with their key groups, ordered by timestamp alone, with
// lazy deletion: no owner is encoded to register, delete or order timers.
// Ties are ordered when their timestamp comes due: the heap's timers of
// that timestamp are taken out as a batch and sorted by their owners'
// encodings, and fire from the batch in that order (a timer registered at
// the batch's timestamp while it fires joins it in order; one registered
// earlier fires first).
//
// The set is hashed once per timer registered (an insert that tells
// whether the id was there) and once per timer fired (its delete): dead
// counts exactly the heap's and the batch's entries that are not live
// timers (deleted ones, and the older copy of a timer deleted and
// registered again), so while it is 0, as it is for timers that are never
// deleted (the window operator's aligned windows), no entry is looked up
// to know whether it is live.
type timerQueue[T comparable] struct {
	set  map[timerID[T]]struct{} // live timers
	heap []kgTimer[T]            // live and dead entries, by timestamp
	dead int                     // entries of heap and batch[cur:] that are not live timers
	enc  ownerEncoder[T]
	// cmp, when set, orders owners as the bytes of their encodings
	// compare, without encoding them (ownerOrder): ties of a timestamp
	// are then sorted on the owners themselves.
	cmp func(a, b T) int

	// batch[cur:] are the timers of timestamp batchTS due to fire, in
	// order (dead ones are skipped).
	batch   []kgTimer[T]
	cur     int
	batchTS int64
	scratch []byte // encodings while ordering a batch

	probes int // operations on set (what the tests count)
}

func newTimerQueue[T comparable](enc ownerEncoder[T]) *timerQueue[T] {
	return &timerQueue[T]{set: map[timerID[T]]struct{}{}, enc: enc}
}

// register adds the timer (ts, owner) in key group kg; false if it exists.
func (q *timerQueue[T]) register(kg int, owner T, ts int64) bool {
	id := timerID[T]{ts: ts, owner: owner}
	n := len(q.set)
	q.probes++
	q.set[id] = struct{}{} // one probe: inserted, or there already
	if len(q.set) == n {
		return false
	}
	e := kgTimer[T]{id: id, kg: int32(kg)}
	if q.cur < len(q.batch) && ts == q.batchTS {
		q.insertInBatch(e)
		return true
	}
	q.push(e)
	return true
}

// isLive reports whether an entry of the heap or the batch is a live timer.
func (q *timerQueue[T]) isLive(id timerID[T]) bool {
	if q.dead == 0 {
		return true
	}
	q.probes++
	_, ok := q.set[id]
	return ok
}

// insertInBatch puts e into the batch being fired, at its place by owner.
func (q *timerQueue[T]) insertInBatch(e kgTimer[T]) {
	if q.cmp != nil {
		i, _ := slices.BinarySearchFunc(q.batch[q.cur:], e, func(x, y kgTimer[T]) int { return q.cmp(x.id.owner, y.id.owner) })
		q.batch = slices.Insert(q.batch, q.cur+i, e)
		return
	}
	q.scratch = q.enc(q.scratch[:0], e.id.owner)
	n := len(q.scratch)
	rest := q.batch[q.cur:]
	i, _ := slices.BinarySearchFunc(rest, e, func(x, _ kgTimer[T]) int {
		q.scratch = q.enc(q.scratch[:n], x.id.owner)
		return bytes.Compare(q.scratch[n:], q.scratch[:n])
	})
	q.batch = slices.Insert(q.batch, q.cur+i, e)
}

// remove deletes the timer (ts, owner); false if there is none.
func (q *timerQueue[T]) remove(owner T, ts int64) bool {
	id := timerID[T]{ts: ts, owner: owner}
	q.probes += 2
	if _, ok := q.set[id]; !ok {
		return false
	}
	delete(q.set, id)
	q.dead++ // its entry stays, dead
	if q.dead > 64 && q.dead > len(q.set) {
		q.compact()
	}
	return true
}

// compact drops the dead entries of the heap and of the batch's rest,
// keeping one entry per live timer (and the batch's order).
func (q *timerQueue[T]) compact() {
	if q.dead == 0 {
		return
	}
	// A live timer may have two entries (deleted, registered again): the
	// first kept takes it out of the set, so the second is dropped; every
	// kept one goes back after.
	keep := func(es []kgTimer[T]) []kgTimer[T] {
		out := es[:0]
		for _, e := range es {
			if _, ok := q.set[e.id]; ok {
				delete(q.set, e.id)
				out = append(out, e)
			}
		}
		clear(es[len(out):])
		return out
	}
	rest := keep(q.batch[q.cur:])
	q.batch = q.batch[:q.cur+len(rest)]
	q.heap = keep(q.heap)
	for _, e := range rest {
		q.set[e.id] = struct{}{}
	}
	for _, e := range q.heap {
		q.set[e.id] = struct{}{}
	}
	q.dead = 0
	for i := len(q.heap)/2 - 1; i >= 0; i-- {
		q.down(i)
	}
}

func (q *timerQueue[T]) push(e kgTimer[T]) {
	q.heap = append(q.heap, e)
	q.up(len(q.heap) - 1)
}

func (q *timerQueue[T]) pop() kgTimer[T] {
	h := q.heap
	e := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h[n] = kgTimer[T]{}
	q.heap = h[:n]
	if n > 0 {
		q.down(0)
	}
	return e
}

func (q *timerQueue[T]) up(i int) {
	h := q.heap
	x := h[i]
	for i > 0 {
		p := (i - 1) / 2
		if h[p].id.ts <= x.id.ts {
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
		if r := c + 1; r < n && h[r].id.ts < h[c].id.ts {
			c = r
		}
		if x.id.ts <= h[c].id.ts {
			break
		}
		h[i] = h[c]
		i = c
	}
	h[i] = x
}

// heapMin drops the heap's dead head entries and returns the earliest live
// timestamp in the heap.
func (q *timerQueue[T]) heapMin() (int64, bool) {
	for len(q.heap) > 0 {
		if q.isLive(q.heap[0].id) {
			return q.heap[0].id.ts, true
		}
		q.pop()
		q.dead--
	}
	return 0, false
}

// batchHead skips the batch's dead entries and reports whether a live one
// remains.
func (q *timerQueue[T]) batchHead() bool {
	for q.cur < len(q.batch) {
		if q.isLive(q.batch[q.cur].id) {
			return true
		}
		q.batch[q.cur] = kgTimer[T]{}
		q.cur++
		q.dead--
	}
	q.endBatch()
	return false
}

func (q *timerQueue[T]) endBatch() {
	clear(q.batch)
	q.batch, q.cur = q.batch[:0], 0
}

// peek returns the earliest live timer's timestamp.
func (q *timerQueue[T]) peek() (int64, bool) {
	ts, ok := q.heapMin()
	if q.batchHead() && (!ok || q.batchTS < ts) {
		return q.batchTS, true
	}
	return ts, ok
}

// next removes and returns the earliest timer at or before upTo, with its
// key group; false when there is none. Call it in a loop: a timer
// registered by a firing one (at or before upTo) fires in the same loop.
func (q *timerQueue[T]) next(upTo int64) (timerID[T], int, bool) {
	for {
		if q.batchHead() {
			if ts, ok := q.heapMin(); ok && ts < q.batchTS {
				// Registered while the batch fired, earlier than it: it
				// fires first, the batch's rest goes back to the heap
				// (dead entries too: dead counts them still).
				for _, e := range q.batch[q.cur:] {
					q.push(e)
				}
				q.endBatch()
				continue
			}
			if q.batchTS > upTo {
				return timerID[T]{}, 0, false
			}
			e := q.batch[q.cur]
			q.batch[q.cur] = kgTimer[T]{}
			q.cur++
			q.probes++
			delete(q.set, e.id)
			return e.id, int(e.kg), true
		}
		ts, ok := q.heapMin()
		if !ok || ts > upTo {
			return timerID[T]{}, 0, false
		}
		for len(q.heap) > 0 && q.heap[0].id.ts == ts {
			// Dead entries go into the batch too (dead counts them
			// there), skipped when their turn comes.
			q.batch = append(q.batch, q.pop())
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
func (q *timerQueue[T]) len() int { return len(q.set) }

// kgTimer is a timer with its key group: an entry of the queue's heap and
// batch, and what a snapshot copies.
type kgTimer[T comparable] struct {
	id timerID[T]
	kg int32
}

// live copies the live timers (the synchronous part of a snapshot: typed
// ids, nothing encoded), after dropping the dead entries if there are any.
func (q *timerQueue[T]) live() []kgTimer[T] {
	q.compact()
	out := make([]kgTimer[T], 0, len(q.set))
	out = append(out, q.batch[q.cur:]...)
	return append(out, q.heap...)
}

// groupTimers groups timers by key group, each group sorted by timestamp
// and then by the owner's encoding.
func groupTimers[T comparable](ts []kgTimer[T], enc ownerEncoder[T]) map[int][]timerID[T] {
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
	// Each owner is encoded once per snapshot, not at each comparison.
	type keyed struct {
		off, end int
		id       timerID[T]
	}
	var ks []keyed
	var b []byte
	for _, ids := range out {
		ks, b = ks[:0], b[:0]
		for _, id := range ids {
			off := len(b)
			b = enc(b, id.owner)
			ks = append(ks, keyed{off, len(b), id})
		}
		slices.SortFunc(ks, func(x, y keyed) int {
			if x.id.ts != y.id.ts {
				return cmpInt64(x.id.ts, y.id.ts)
			}
			return bytes.Compare(b[x.off:x.end], b[y.off:y.end])
		})
		for i, k := range ks {
			ids[i] = k.id
		}
	}
	return out
}

// A key group's timers of both domains are encoded in one blob: a count
// (uvarint), then per timer its domain, timestamp (varint) and owner
// (framed); appendTimerEntries appends the timers of one domain after the
// count.

// appendTimerEntries appends timers of domain d: per timer d, the
// timestamp (varint) and the owner (framed).
func appendTimerEntries[T comparable](dst []byte, enc ownerEncoder[T], d TimeDomain, ids []timerID[T]) []byte {
	var ob []byte
	for _, id := range ids {
		dst = append(dst, byte(d))
		dst = binary.AppendVarint(dst, id.ts)
		ob = enc(ob[:0], id.owner)
		dst = appendFrame(dst, ob)
	}
	return dst
}

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
