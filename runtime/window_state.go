package runtime

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// The window operator's state on the heap backend: per key, its windows'
// accumulators in a slice sorted by window, not a Go map per key. A key of
// a tumbling window holds one or two windows; a Go map of one entry costs
// a group of eight slots (over 300 bytes for a window and a small
// accumulator) and a hash of the window at each access, where the slice
// costs the entries and a scan of one or two. Keys with many windows
// (sliding panes, sessions) are searched by bisection.
//
// It is a map state (mapStore) behind MapState, under the same name and in
// the same canonical bytes as a MapState[TimeWindow, ACC] (mapCodec: a
// count, then framed window and accumulator pairs), so that checkpoints and
// savepoints restore either way and on the pebble backend (where the window
// operator keeps a pebble MapState, one pebble key per window).

// windowEntry is one window of a key and its accumulator.
type windowEntry[ACC any] struct {
	w   TimeWindow
	acc ACC
}

// windowLinear is how many windows a key holds before lookups bisect.
const windowLinear = 8

// cmpWindow orders windows by start, then end.
func cmpWindow(a, b TimeWindow) int {
	if c := cmpInt64(a.Start, b.Start); c != 0 {
		return c
	}
	return cmpInt64(a.End, b.End)
}

// findWindow returns w's position in es (sorted), or where it goes.
func findWindow[ACC any](es []windowEntry[ACC], w TimeWindow) (int, bool) {
	if len(es) <= windowLinear {
		for i := range es {
			switch c := cmpWindow(es[i].w, w); {
			case c == 0:
				return i, true
			case c > 0:
				return i, false
			}
		}
		return len(es), false
	}
	return slices.BinarySearchFunc(es, w, func(e windowEntry[ACC], w TimeWindow) int { return cmpWindow(e.w, w) })
}

// heapWindows is the heap window store: a keyedStore of each key's sorted
// windows, copy-on-write per key while a snapshot holds them (clone copies
// the key's slice).
type heapWindows[K comparable, ACC any] struct {
	s *keyedStore[K, []windowEntry[ACC]]
}

// newWindowState declares the window operator's state: a pebble MapState
// on the pebble backend, heapWindows on the heap.
func newWindowState[ACC any, K comparable](r *StateRegistry[K], c Codec[ACC]) (*MapState[TimeWindow, ACC], error) {
	if c == nil {
		if err := CheckDefaultCodec[ACC](); err != nil {
			return nil, Unrecoverable(fmt.Errorf("window state %q values: %w", windowState, err))
		}
		c = DefaultCodec[ACC]()
	}
	if r.b.pebble != nil {
		return newMapState[TimeWindow, ACC](r, windowState, windowCodec{}, c)
	}
	s := &keyedStore[K, []windowEntry[ACC]]{
		stateName: windowState, scope: &r.b.scope, groups: make([]*keyGroupMap[K, []windowEntry[ACC]], r.b.maxPar),
		keyCodec: r.b.keyCodec, valCodec: windowListCodec[ACC]{c},
		clone:   slices.Clone[[]windowEntry[ACC]],
		entries: windowEntries[ACC],
		empty:   noWindows[ACC],
	}
	if err := r.b.register(s); err != nil {
		return nil, err
	}
	return &MapState[TimeWindow, ACC]{s: heapWindows[K, ACC]{s}}, nil
}

func (h heapWindows[K, ACC]) get(w TimeWindow) (ACC, bool) {
	es, _ := h.s.get()
	if i, ok := findWindow(es, w); ok {
		return es[i].acc, true
	}
	var zero ACC
	return zero, false
}

// cachedEntry reports whether the key in scope has window w: the heap
// always knows (the window operator's cachedPanes).
func (h heapWindows[K, ACC]) cachedEntry(w TimeWindow) (present, known bool) {
	_, ok := h.get(w)
	return ok, true
}

func (h heapWindows[K, ACC]) put(w TimeWindow, acc ACC) {
	es, _ := h.s.getForWrite() // the key's own slice (cloned if a snapshot shares it)
	i, ok := findWindow(es, w)
	if ok {
		es[i].acc = acc
		return
	}
	h.s.put(slices.Insert(es, i, windowEntry[ACC]{w: w, acc: acc}))
}

func (h heapWindows[K, ACC]) remove(w TimeWindow) {
	es, _ := h.s.getForWrite()
	i, ok := findWindow(es, w)
	if !ok {
		return
	}
	es = slices.Delete(es, i, i+1) // zeroes the freed last entry
	if len(es) == 0 {
		// The key keeps its entry and its slice: its next window (a
		// word of the next second) reuses both (keyedStore.empty), but
		// not what a burst of windows grew.
		if cap(es) > 2*windowLinear {
			es = nil
		}
		h.s.put(es)
		return
	}
	if cap(es) > 2*windowLinear && len(es) < cap(es)/4 {
		es = slices.Clip(slices.Clone(es)) // release what a burst of windows grew
	}
	h.s.put(es)
}

func (h heapWindows[K, ACC]) each(fn func(TimeWindow, ACC) bool) {
	es, _ := h.s.get()
	for _, e := range es {
		if !fn(e.w, e.acc) {
			return
		}
	}
}

func (h heapWindows[K, ACC]) len() int {
	es, _ := h.s.get()
	return len(es)
}

func (h heapWindows[K, ACC]) clear() { h.s.del() }

// noWindows reports a key without windows (keyedStore.empty).
func noWindows[ACC any](es []windowEntry[ACC]) bool { return len(es) == 0 }

// windowEntries calls fn for each window of es (keyedStore.entries, for
// state dumps: one record per window, as a map state's).
func windowEntries[ACC any](es []windowEntry[ACC], fn func(k, v any) error) error {
	for _, e := range es {
		if err := fn(e.w, e.acc); err != nil {
			return err
		}
	}
	return nil
}

// windowListCodec encodes a key's windows as mapCodec[TimeWindow, ACC]
// encodes a map of them, and decodes that encoding sorted by window.
type windowListCodec[ACC any] struct{ c Codec[ACC] }

func (l windowListCodec[ACC]) Append(dst []byte, es []windowEntry[ACC]) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(es)))
	var wb [16]byte
	for _, e := range es {
		dst = appendFrame(dst, windowCodec{}.Append(wb[:0], e.w))
		n := len(dst)
		// Frame the accumulator in place: encode it after a one-byte
		// length, which covers accumulators below 128 bytes, else move it.
		dst = l.c.Append(append(dst, 0), e.acc)
		if sz := len(dst) - n - 1; sz < 0x80 {
			dst[n] = byte(sz)
		} else {
			var hdr [binary.MaxVarintLen64]byte
			k := binary.PutUvarint(hdr[:], uint64(sz))
			dst = append(dst, hdr[:k-1]...)
			copy(dst[n+k:], dst[n+1:n+1+sz])
			copy(dst[n:], hdr[:k])
		}
	}
	return dst
}

func (l windowListCodec[ACC]) Decode(b []byte) ([]windowEntry[ACC], error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) { // every entry takes at least two bytes
		return nil, fmt.Errorf("%w: window count", ErrDecode)
	}
	b = b[k:]
	es := make([]windowEntry[ACC], 0, n)
	for range n {
		wb, rest, err := readFrame(b)
		if err != nil {
			return nil, err
		}
		ab, rest, err := readFrame(rest)
		if err != nil {
			return nil, err
		}
		b = rest
		w, err := windowCodec{}.Decode(wb)
		if err != nil {
			return nil, err
		}
		acc, err := l.c.Decode(ab)
		if err != nil {
			return nil, err
		}
		es = append(es, windowEntry[ACC]{w: w, acc: acc})
	}
	slices.SortStableFunc(es, func(a, b windowEntry[ACC]) int { return cmpWindow(a.w, b.w) })
	// A window twice (no encoder writes it) keeps its last value, as a map
	// decoded from the same bytes.
	out := es[:0]
	for i, e := range es {
		if i+1 < len(es) && es[i+1].w == e.w {
			continue
		}
		out = append(out, e)
	}
	clear(es[len(out):])
	return out, nil
}
