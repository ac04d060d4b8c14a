package runtime

import (
	"container/heap"
	"encoding/binary"
	"fmt"
	"sort"
)

// timerID names one timer of a queue: its timestamp and its owner (the
// encoded key and namespace). A queue holds at most one timer per id.
type timerID struct {
	ts    int64
	owner string
}

func (a timerID) less(b timerID) bool {
	if a.ts != b.ts {
		return a.ts < b.ts
	}
	return a.owner < b.owner
}

// timerQueue is the timers of one time domain of one timer service of a
// keyed operator subtask, as a pure state machine: register, delete and
// next (the firing of every timer at or before a time, earliest first,
// ties by owner so the order is the same after a restore) over a min-heap
// with lazy deletion, and each timer's key group for snapshots by key
// group. It holds no clock and calls nothing.
type timerQueue struct {
	set  map[timerID]int // live timers -> key group
	heap timerHeap       // live and deleted (dead) timers
	dead int             // deleted entries still in heap
}

func newTimerQueue() *timerQueue { return &timerQueue{set: map[timerID]int{}} }

type timerHeap []timerID

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].less(h[j]) }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timerID)) }
func (h *timerHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// register adds the timer (ts, owner) in key group kg; false if it exists.
func (q *timerQueue) register(kg int, owner string, ts int64) bool {
	id := timerID{ts: ts, owner: owner}
	if _, ok := q.set[id]; ok {
		return false
	}
	q.set[id] = kg
	heap.Push(&q.heap, id)
	return true
}

// remove deletes the timer (ts, owner); false if there is none.
func (q *timerQueue) remove(owner string, ts int64) bool {
	id := timerID{ts: ts, owner: owner}
	if _, ok := q.set[id]; !ok {
		return false
	}
	delete(q.set, id)
	q.dead++
	if q.dead > 64 && q.dead > len(q.set) {
		q.compact()
	}
	return true
}

// compact drops the heap's dead entries.
func (q *timerQueue) compact() {
	h := q.heap[:0]
	for _, id := range q.heap {
		if _, ok := q.set[id]; ok {
			h = append(h, id)
		}
	}
	clear(q.heap[len(h):])
	q.heap, q.dead = h, 0
	heap.Init(&q.heap)
}

// peek returns the earliest live timer.
func (q *timerQueue) peek() (timerID, bool) {
	for len(q.heap) > 0 {
		id := q.heap[0]
		if _, ok := q.set[id]; ok {
			return id, true
		}
		heap.Pop(&q.heap)
		q.dead--
	}
	return timerID{}, false
}

// next removes and returns the earliest timer at or before upTo, with its
// key group; false when there is none. Call it in a loop: a timer
// registered by a firing one (at or before upTo) fires in the same loop.
func (q *timerQueue) next(upTo int64) (timerID, int, bool) {
	id, ok := q.peek()
	if !ok || id.ts > upTo {
		return timerID{}, 0, false
	}
	heap.Pop(&q.heap)
	kg := q.set[id]
	delete(q.set, id)
	return id, kg, true
}

// len is the number of live timers.
func (q *timerQueue) len() int { return len(q.set) }

// byKeyGroup returns the live timers by key group, each group sorted.
func (q *timerQueue) byKeyGroup() map[int][]timerID {
	out := map[int][]timerID{}
	for id, kg := range q.set {
		out[kg] = append(out[kg], id)
	}
	for _, ids := range out {
		sort.Slice(ids, func(i, j int) bool { return ids[i].less(ids[j]) })
	}
	return out
}

// appendTimers encodes a key group's timers of both domains: a count, then
// per timer its domain, timestamp (varint) and owner (framed).
func appendTimers(dst []byte, event, proc []timerID) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(event)+len(proc)))
	for d, ids := range [][]timerID{event, proc} {
		for _, id := range ids {
			dst = append(dst, byte(EventTime)+byte(d))
			dst = binary.AppendVarint(dst, id.ts)
			dst = appendFrame(dst, []byte(id.owner))
		}
	}
	return dst
}

// decodeTimers calls add for every timer appendTimers encoded.
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
