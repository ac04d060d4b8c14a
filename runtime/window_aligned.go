package runtime

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
)

// The window operator's state for event-time tumbling windows on the heap
// backend (Flink's default trigger; Weir has no other): the keys of each
// window, a window at a time, as a hand-written loop keeps a map per
// window, instead of each key's windows and a timer per key and window.
//
//   - A record costs one probe of its window's index (its key's position
//     in the window's entries), its accumulator updated in place: no
//     lookup of the key's windows, no timer registered.
//   - The watermark fires a window for all its keys in one pass over its
//     entries (alignedWindows is a timer service of the operator's timer
//     host), and drops it whole at its cleanup time: no timer queue entry,
//     no probe and no delete per key and window.
//
// What a checkpoint holds is unchanged: the "window-contents" state in the
// bytes of the heap window store (per key group, each key's windows and
// accumulators, windowListCodec) and, in the operator's default timers,
// each key's timers as the general path registers them (the fire time of
// a window that has not fired, the cleanup time when it differs or the
// window fired), made from the windows when a snapshot is encoded. So a
// checkpoint or savepoint of either path restores into the other, into the
// pebble backend and at any parallelism (key groups as before). A restore
// takes the keys' timers of the restored windows out of the default timers
// (a window whose fire timer is gone fired before the checkpoint, as can
// differ by key group after a rescale) and the windows fire from then on
// in passes.
//
// Sliding windows, sessions, processing time and the pebble backend keep
// the general path (window_operator.go).

// alignedEntry is one key's accumulator in one window.
type alignedEntry[K comparable, ACC any] struct {
	key K
	acc ACC
	kg  int32
	// fired: the window fired for this key before the checkpoint it was
	// restored from (its window's fired covers every other entry).
	fired bool
}

// alignedWindow is one window's keys: entries in arrival order, each key's
// position in idx. A snapshot takes the entries (ents[:n:n]): while shared,
// changing an entry copies them first; appending writes beyond every
// snapshot's length.
type alignedWindow[K comparable, ACC any] struct {
	w      TimeWindow
	idx    map[K]int32
	ents   []alignedEntry[K, ACC]
	shared bool
	// fired: the watermark reached the window's fire time and its keys
	// fired (or it was made after that, by a record within the allowed
	// lateness, whose records fire it at once).
	fired bool
}

// alignedWindows is the heap state of an event-time tumbling window
// operator: its windows, earliest first, and the firing of each window's
// keys when the watermark reaches its end (a timerService of the host).
type alignedWindows[K comparable, ACC any] struct {
	scope *keyScope[K]
	host  *timerHost[K]
	// codec is a heap window store that holds no state: its codecs encode
	// and decode the windows as the general path's state, and it dumps
	// them.
	codec    *keyedStore[K, []windowEntry[ACC]]
	wins     []*alignedWindow[K, ACC] // by start
	cleanup  func(TimeWindow) int64
	lateness int64
	// spare are indexes of dropped windows, cleared, for new windows.
	spare []map[K]int32
	// firing is the timer a window's key fires with (host.firing during
	// OnTimer), and fw, fi the window and entry it fires.
	firing firingTimer
	fw     *alignedWindow[K, ACC]
	fi     int
}

// newAlignedWindows declares the aligned window state in r (restoring it)
// and takes the restored windows' timers out of dt, the operator's
// default timers; nil if r is not a heap backend with default timers.
func newAlignedWindows[K comparable, ACC any](r *StateRegistry[K], c Codec[ACC], lateness int64, cleanup func(TimeWindow) int64) (*alignedWindows[K, ACC], error) {
	if r.b.pebble != nil || r.b.timers == nil {
		return nil, nil
	}
	var dt *Timers[K, struct{}]
	for _, s := range r.b.timers.services {
		if t, ok := s.(*Timers[K, struct{}]); ok && t.svcName == "" {
			dt = t
		}
	}
	if dt == nil {
		return nil, nil
	}
	if c == nil {
		if err := CheckDefaultCodec[ACC](); err != nil {
			return nil, Unrecoverable(fmt.Errorf("window state %q values: %w", windowState, err))
		}
		c = DefaultCodec[ACC]()
	}
	a := &alignedWindows[K, ACC]{scope: &r.b.scope, host: r.b.timers, cleanup: cleanup, lateness: lateness,
		codec: &keyedStore[K, []windowEntry[ACC]]{stateName: windowState, scope: &r.b.scope,
			groups: make([]*keyGroupMap[K, []windowEntry[ACC]], r.b.maxPar), keyCodec: r.b.keyCodec,
			valCodec: windowListCodec[ACC]{c}, entries: windowEntries[ACC], empty: noWindows[ACC]}}
	if err := r.b.register(a); err != nil {
		return nil, err
	}
	a.adoptTimers(dt.q[EventTime-1])
	dt.moreEvent = a.frozenTimers
	r.b.timers.services = append(r.b.timers.services, a)
	return a, nil
}

// adoptTimers takes the restored windows' timers out of q: an entry whose
// fire timer is not there fired before the checkpoint (its window's end
// reached the watermark of the subtask that took it; a timer at that time
// is then due, so no other window's cleanup timer can stand for it).
func (a *alignedWindows[K, ACC]) adoptTimers(q timerStore[timerOwner[K, struct{}]]) {
	for _, win := range a.wins {
		for i := range win.ents {
			e := &win.ents[i]
			e.fired = !q.remove(int(e.kg), timerOwner[K, struct{}]{key: e.key}, win.w.MaxTimestamp())
		}
	}
	for _, win := range a.wins {
		cl := a.cleanup(win.w)
		for _, e := range win.ents {
			q.remove(int(e.kg), timerOwner[K, struct{}]{key: e.key}, cl)
		}
	}
}

// window returns w's window, made (fired if the watermark is past its
// fire time already) if missing.
func (a *alignedWindows[K, ACC]) window(w TimeWindow) *alignedWindow[K, ACC] {
	// Records come mostly to the latest window: search from the end.
	i := len(a.wins)
	for i > 0 {
		switch c := cmpWindow(a.wins[i-1].w, w); {
		case c == 0:
			return a.wins[i-1]
		case c < 0:
			return a.insert(i, w)
		}
		i--
	}
	return a.insert(0, w)
}

func (a *alignedWindows[K, ACC]) insert(i int, w TimeWindow) *alignedWindow[K, ACC] {
	win := &alignedWindow[K, ACC]{w: w, fired: w.MaxTimestamp() <= a.host.watermark}
	if n := len(a.spare); n > 0 {
		win.idx, a.spare = a.spare[n-1], a.spare[:n-1]
	} else {
		win.idx = map[K]int32{}
	}
	a.wins = slices.Insert(a.wins, i, win)
	return win
}

// entry returns the current key's entry in win, made with acc from create
// if missing; the entry may be changed.
func (a *alignedWindows[K, ACC]) entry(win *alignedWindow[K, ACC], create func() ACC) *alignedEntry[K, ACC] {
	if i, ok := win.idx[a.scope.key]; ok {
		if win.shared {
			win.ents = slices.Clone(win.ents)
			win.shared = false
		}
		return &win.ents[i]
	}
	key := ownKey(a.scope.key)
	win.idx[key] = int32(len(win.ents))
	win.ents = append(win.ents, alignedEntry[K, ACC]{key: key, acc: create(), kg: int32(a.scope.kg)})
	return &win.ents[len(win.ents)-1]
}

// fire fires, when the watermark reaches upTo, every window whose fire
// time it reached for each of its keys (through the host's OnTimer, as a
// timer of the key at the window's last millisecond), earliest first, and
// drops the windows whose cleanup time it reached.
func (a *alignedWindows[K, ACC]) fire(d TimeDomain, upTo int64) error {
	if d != EventTime {
		return nil
	}
	for _, win := range a.wins {
		if win.w.MaxTimestamp() > upTo {
			break
		}
		if win.fired {
			continue
		}
		a.firing = firingTimer{service: a, domain: EventTime, ts: win.w.MaxTimestamp()}
		for i := range win.ents {
			if win.ents[i].fired {
				continue
			}
			e := &win.ents[i]
			a.scope.setKey(e.key, int(e.kg))
			a.fw, a.fi = win, i
			if err := a.host.fire(&a.firing); err != nil {
				return err
			}
		}
		a.fw = nil
		win.fired = true
	}
	n := 0
	for n < len(a.wins) && a.cleanup(a.wins[n].w) <= upTo {
		win := a.wins[n]
		clear(win.idx)
		a.spare = append(a.spare, win.idx)
		a.wins[n] = nil
		n++
	}
	if n > 0 {
		a.wins = slices.Delete(a.wins, 0, n)
	}
	return nil
}

// firingEntry is the window and entry being fired (during OnTimer), if
// the firing timer is a's.
func (a *alignedWindows[K, ACC]) firingEntry(f *firingTimer) (TimeWindow, *alignedEntry[K, ACC], bool) {
	if f == nil || f.service != a || a.fw == nil {
		return TimeWindow{}, nil, false
	}
	return a.fw.w, &a.fw.ents[a.fi], true
}

func (a *alignedWindows[K, ACC]) nextProcessingTime() (int64, bool) { return 0, false }

// alignedWindows is the "window-contents" state (stateSnapshotter).

func (a *alignedWindows[K, ACC]) name() string { return windowState }
func (a *alignedWindows[K, ACC]) close() error { return nil }

func (a *alignedWindows[K, ACC]) dump(kg int, data []byte, emit func(StateRecord) error) error {
	return a.codec.dump(kg, data, emit)
}

// restore adds a key group's windows (the heap window store's bytes).
func (a *alignedWindows[K, ACC]) restore(kg int, b []byte) error {
	// The codec decodes into its store and index; what it decoded moves
	// to the windows, and the codec keeps nothing (a key left in its
	// index would hold the key's memory and point into a dropped group).
	defer func() { a.codec.groups[kg], a.codec.idx, a.codec.atGen = nil, nil, 0 }()
	if err := a.codec.restore(kg, b); err != nil {
		return err
	}
	g := a.codec.groups[kg]
	if g == nil {
		return nil
	}
	for _, se := range g.ents {
		a.scope.setKey(se.key, kg)
		for _, we := range se.val {
			win := a.window(we.w)
			win.fired = false // each entry says (adoptTimers)
			acc := we.acc
			a.entry(win, func() ACC { return acc }).acc = acc
		}
	}
	return nil
}

// frozenWindow is a window at a snapshot.
type frozenWindow[K comparable, ACC any] struct {
	w     TimeWindow
	ents  []alignedEntry[K, ACC]
	fired bool
}

// frozen marks every window shared and returns them.
func (a *alignedWindows[K, ACC]) frozen() []frozenWindow[K, ACC] {
	out := make([]frozenWindow[K, ACC], len(a.wins))
	for i, win := range a.wins {
		win.shared = true
		out[i] = frozenWindow[K, ACC]{w: win.w, ents: win.ents[:len(win.ents):len(win.ents)], fired: win.fired}
	}
	return out
}

// entryRef is an entry of a frozen window: the window's and the entry's
// positions.
type entryRef struct{ win, ent int32 }

// refsByKeyGroup groups the entries of wins by key group.
func refsByKeyGroup[K comparable, ACC any](wins []frozenWindow[K, ACC]) map[int][]entryRef {
	out := map[int][]entryRef{}
	for wi, fw := range wins {
		for ei, e := range fw.ents {
			out[int(e.kg)] = append(out[int(e.kg)], entryRef{int32(wi), int32(ei)})
		}
	}
	return out
}

func (a *alignedWindows[K, ACC]) freeze() frozenState {
	return &frozenAligned[K, ACC]{a: a, wins: a.frozen()}
}

// frozenAligned encodes the windows at a snapshot as the heap window
// store's key groups: each key, then its windows by start.
type frozenAligned[K comparable, ACC any] struct {
	a    *alignedWindows[K, ACC]
	wins []frozenWindow[K, ACC]
	refs map[int][]entryRef
	pos  map[K]int32
	ents []stateEntry[K, []windowEntry[ACC]]
	kb   []byte
	vb   []byte
}

func (f *frozenAligned[K, ACC]) keyGroups() ([]int, error) {
	if f.refs == nil {
		f.refs = refsByKeyGroup(f.wins)
	}
	return slices.Collect(maps.Keys(f.refs)), nil
}

func (f *frozenAligned[K, ACC]) appendKeyGroup(b []byte, kg int) ([]byte, bool, error) {
	refs, ok := f.refs[kg]
	if !ok {
		return b, false, nil
	}
	delete(f.refs, kg)
	if f.pos == nil {
		f.pos = map[K]int32{}
	}
	clear(f.pos)
	f.ents = f.ents[:0]
	for _, r := range refs { // windows by start: each key's windows sorted
		fw := &f.wins[r.win]
		e := &fw.ents[r.ent]
		i, ok := f.pos[e.key]
		if !ok {
			i = int32(len(f.ents))
			f.pos[e.key] = i
			f.ents = append(f.ents, stateEntry[K, []windowEntry[ACC]]{key: e.key})
		}
		f.ents[i].val = append(f.ents[i].val, windowEntry[ACC]{w: fw.w, acc: e.acc})
	}
	b = binary.AppendUvarint(b, uint64(len(f.ents)))
	for _, e := range f.ents {
		f.kb = f.a.codec.keyCodec.Append(f.kb[:0], e.key)
		f.vb = f.a.codec.valCodec.Append(f.vb[:0], e.val)
		b = appendFrame(b, f.kb)
		b = appendFrame(b, f.vb)
	}
	clear(f.ents)
	return b, true, nil
}

// frozenTimers adds to ev, the default timers' event-time timers at a
// snapshot, the timers the general path keeps for the windows: per key
// and window, its fire time if it has not fired, its cleanup time if that
// differs or it fired (one timer per key and time).
func (a *alignedWindows[K, ACC]) frozenTimers(ev frozenTimers, enc ownerEncoder[timerOwner[K, struct{}]]) frozenTimers {
	return &frozenAlignedTimers[K, ACC]{ev: ev, enc: enc, wins: a.frozen(), cleanup: a.cleanup, lateness: a.lateness}
}

type frozenAlignedTimers[K comparable, ACC any] struct {
	ev       frozenTimers
	enc      ownerEncoder[timerOwner[K, struct{}]]
	wins     []frozenWindow[K, ACC]
	cleanup  func(TimeWindow) int64
	lateness int64
	refs     map[int][]entryRef
	ids      []timerID[timerOwner[K, struct{}]]
	seen     map[timerID[timerOwner[K, struct{}]]]struct{}
	sorter   timerSorter
}

func (f *frozenAlignedTimers[K, ACC]) keyGroups() ([]int, error) {
	kgs, err := f.ev.keyGroups()
	if err != nil {
		return nil, err
	}
	if f.refs == nil {
		f.refs = refsByKeyGroup(f.wins)
	}
	for kg := range f.refs {
		if !slices.Contains(kgs, kg) {
			kgs = append(kgs, kg)
		}
	}
	return kgs, nil
}

func (f *frozenAlignedTimers[K, ACC]) appendKeyGroup(dst []byte, kg int, d TimeDomain) ([]byte, int, error) {
	dst, n, err := f.ev.appendKeyGroup(dst, kg, d)
	if err != nil {
		return dst, n, err
	}
	refs := f.refs[kg]
	delete(f.refs, kg)
	if len(refs) == 0 {
		return dst, n, nil
	}
	f.ids = f.ids[:0]
	if f.lateness > 0 && f.seen == nil {
		f.seen = map[timerID[timerOwner[K, struct{}]]]struct{}{}
	}
	clear(f.seen)
	add := func(id timerID[timerOwner[K, struct{}]]) {
		if f.seen != nil { // a cleanup time may be another window's fire time
			if _, dup := f.seen[id]; dup {
				return
			}
			f.seen[id] = struct{}{}
		}
		f.ids = append(f.ids, id)
	}
	for _, r := range refs {
		fw := &f.wins[r.win]
		e := &fw.ents[r.ent]
		o := timerOwner[K, struct{}]{key: e.key}
		fired, ft, cl := fw.fired || e.fired, fw.w.MaxTimestamp(), f.cleanup(fw.w)
		if !fired {
			add(timerID[timerOwner[K, struct{}]]{ts: ft, owner: o})
		}
		if fired || cl != ft {
			add(timerID[timerOwner[K, struct{}]]{ts: cl, owner: o})
		}
	}
	dst = appendSortedEntries(&f.sorter, dst, f.enc, d, f.ids)
	clear(f.ids)
	return dst, n + len(f.ids), nil
}
