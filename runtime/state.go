package runtime

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"
)

// ValueState is one value per key, scoped to the key of the record being
// processed. Values are stored by value: a value that holds pointers, slices
// or maps must not be changed after Update (snapshots may still read it).
type ValueState[T any] struct {
	s valueStore[T]
}

// Value returns the current key's value and whether it is set.
func (v *ValueState[T]) Value() (T, bool) { return v.s.get() }

// Update sets the current key's value.
func (v *ValueState[T]) Update(x T) { v.s.put(x) }

// Clear removes the current key's value.
func (v *ValueState[T]) Clear() { v.s.del() }

// MapState is a map per key, scoped to the key of the record being processed.
type MapState[UK comparable, UV any] struct {
	s mapStore[UK, UV]
}

// Get returns the current key's value for uk.
func (m *MapState[UK, UV]) Get(uk UK) (UV, bool) { return m.s.get(uk) }

// Put sets the current key's value for uk.
func (m *MapState[UK, UV]) Put(uk UK, uv UV) { m.s.put(uk, uv) }

// Delete removes uk from the current key's map.
func (m *MapState[UK, UV]) Delete(uk UK) { m.s.remove(uk) }

// Range calls fn for each entry of the current key's map until it returns
// false. The map must not be changed from fn.
func (m *MapState[UK, UV]) Range(fn func(UK, UV) bool) { m.s.each(fn) }

// Len is the number of entries of the current key's map.
func (m *MapState[UK, UV]) Len() int { return m.s.len() }

// Clear removes the current key's map.
func (m *MapState[UK, UV]) Clear() { m.s.clear() }

// keyScope is the current key of a keyed operator, shared by its states.
// gen changes with every record (setKey), so that a state can keep where it
// found the current key between a read and the write that follows.
type keyScope[K comparable] struct {
	key K
	kg  int
	gen uint64
}

// setKey scopes the states to key in key group kg for the next record.
func (sc *keyScope[K]) setKey(key K, kg int) {
	sc.key, sc.kg = key, kg
	sc.gen++
}

// stateSnapshotter is the untyped face of one named state of an operator.
type stateSnapshotter interface {
	name() string
	// freeze marks every key group copy-on-write and returns what encodes
	// them; its methods may run on another goroutine while processing goes
	// on.
	freeze() frozenState
	restore(kg int, b []byte) error
	// close releases what the state holds outside the Go heap.
	close() error
}

// frozenState is a state's snapshot being encoded, one key group at a time
// (the asynchronous part of a checkpoint), so that only the key group being
// encoded is ever held twice.
type frozenState interface {
	// keyGroups lists the key groups that hold data, in any order.
	keyGroups() ([]int, error)
	// appendKeyGroup appends kg's encoding to dst; false if kg holds no
	// data.
	appendKeyGroup(dst []byte, kg int) ([]byte, bool, error)
}

// stateEntry is one key's value of one state.
type stateEntry[K comparable, V any] struct {
	key K
	val V
}

// keyGroupMap is one key group of one state: its entries in a slice (each
// key's position in it is in the store's index, keyedStore.idx). A
// snapshot takes the entries (ents[:n:n]) and never the index, so:
//   - shared marks ents[:n] as owned by an in-flight snapshot: changing or
//     removing an entry copies the slice first (a copy of values, not a
//     rehash of the map);
//   - adding an entry appends beyond every snapshot's length, without a
//     copy.
//
// For a reference value (a map state's maps) the copy is of the entries
// only: each value the snapshot still shares is marked in sharedVals and
// deep-copied when it is first written (copy-on-write per entry), so that a
// checkpoint costs a copy of the maps written while it encodes, not of
// every map of every key group written to.
type keyGroupMap[K comparable, V any] struct {
	ents   []stateEntry[K, V]
	shared bool
	// sharedVals marks, by position, the values of ents a snapshot shares
	// (only with a clone function); positions beyond it are not shared.
	sharedVals []uint64
	// idle marks, by position, the entries whose value was empty at the
	// last sweep and has not been set since (a store with an empty
	// function, sweepEmpties); sweepAt is the length at which a new key
	// sweeps next.
	idle    []uint64
	sweepAt int
}

// bit reports bit i of a bitset; setBit sets it (or clears it), growing
// the set as needed.
func bit(set []uint64, i int32) bool {
	w := int(i) / 64
	return w < len(set) && set[w]&(1<<(uint(i)%64)) != 0
}

func setBit(set []uint64, i int32, on bool) []uint64 {
	w := int(i) / 64
	if w >= len(set) {
		if !on {
			return set
		}
		set = append(set, make([]uint64, w+1-len(set))...)
	}
	if on {
		set[w] |= 1 << (uint(i) % 64)
	} else {
		set[w] &^= 1 << (uint(i) % 64)
	}
	return set
}

// valShared reports whether the value at i is shared with a snapshot.
func (g *keyGroupMap[K, V]) valShared(i int32) bool {
	w := int(i) / 64
	return w < len(g.sharedVals) && g.sharedVals[w]&(1<<(uint(i)%64)) != 0
}

// setValShared marks the value at i shared (or not).
func (g *keyGroupMap[K, V]) setValShared(i int32, on bool) {
	w := int(i) / 64
	if w >= len(g.sharedVals) {
		if !on {
			return
		}
		g.sharedVals = append(g.sharedVals, make([]uint64, w+1-len(g.sharedVals))...)
	}
	if on {
		g.sharedVals[w] |= 1 << (uint(i) % 64)
	} else {
		g.sharedVals[w] &^= 1 << (uint(i) % 64)
	}
}

// keyedStore holds one named state of one keyed operator subtask, split by key
// group, copy-on-write at key-group granularity so a snapshot's synchronous
// part is O(key groups) and encoding runs asynchronously.
//
// One index (idx) finds every key of the subtask: a key's lookup is one
// probe of one map, whose header and directory stay in the cache, where a
// map per key group (64 or more per subtask) missed the cache on the key
// group's map before its probe. A key lives in one key group (its key
// group is a function of the key).
//
// A read-modify-write of the current key (Value, then Update) looks the key
// up once: the read keeps its position (at) for the record (scope.gen).
type keyedStore[K comparable, V any] struct {
	stateName string
	scope     *keyScope[K]
	groups    []*keyGroupMap[K, V] // by key group; nil: empty
	// idx is where each key's entry is (nil until the first entry).
	idx      map[K]keyPos
	keyCodec Codec[K]
	valCodec Codec[V]
	clone    func(V) V // deep copy for copy-on-write of reference values; nil: plain copy
	// entries calls fn for each entry of a map value (map state), so a
	// state dump has one record per entry; nil: a value state.
	entries func(v V, fn func(k, v any) error) error
	at      int32 // position of scope.key in its group, -1 absent; valid while atGen == scope.gen
	atGen   uint64
	// filter, if set, is called by freeze; what it returns maps every
	// entry's value to what the snapshot writes, or drops it (a state with
	// TTL drops expired values, state_ttl.go).
	filter func() func(V) (V, bool)
	// empty, if set, tells a value that stands for no value (the window
	// state's key without windows): putting one keeps the key's entry, its
	// position and its value's capacity, so that a key that comes back
	// (the next window's word) costs no index insert, delete or
	// allocation. Snapshots skip such entries; a key group sweeps out
	// those that stayed empty from one sweep to the next (sweepEmpties).
	empty func(V) bool
}

func (s *keyedStore[K, V]) name() string { return s.stateName }

// keyPos is where a key's entry is: its key group (the high 32 bits) and
// its position in the key group's entries.
type keyPos uint64

func posOf(kg int, i int32) keyPos { return keyPos(uint64(kg)<<32 | uint64(uint32(i))) }
func (p keyPos) kg() int           { return int(p >> 32) }
func (p keyPos) pos() int32        { return int32(uint32(p)) }

// index sets key's position to i in key group kg.
func (s *keyedStore[K, V]) index(key K, kg int, i int32) {
	if s.idx == nil {
		s.idx = make(map[K]keyPos)
	}
	s.idx[key] = posOf(kg, i)
}

// lookup returns key's position in key group kg.
func (s *keyedStore[K, V]) lookup(key K, kg int) (int32, bool) {
	p, ok := s.idx[key]
	if !ok || p.kg() != kg {
		return -1, false
	}
	return p.pos(), true
}

// find returns the current key's position in its key group (small
// enough to be inlined: the second access of a record costs a compare).
func (s *keyedStore[K, V]) find() (int32, bool) {
	if s.atGen != s.scope.gen || s.atGen == 0 { // gen 0: no record yet
		s.seek()
	}
	return s.at, s.at >= 0
}

// seek looks the current key up for the record (find).
func (s *keyedStore[K, V]) seek() {
	sc := s.scope
	s.at, s.atGen = -1, sc.gen
	p, ok := s.idx[sc.key]
	if !ok || p.kg() != sc.kg {
		return
	}
	s.at = p.pos()
	// The scope takes the stored key (an equal value): what the record
	// does next with its key (a timer registered, the next state looked
	// up) then shares the store's copy, and a timer's key found again
	// here compares by pointer, not byte by byte.
	sc.key = s.groups[sc.kg].ents[s.at].key
}

func (s *keyedStore[K, V]) get() (V, bool) {
	if s.atGen != s.scope.gen || s.atGen == 0 { // find, inlined
		s.seek()
	}
	if i := s.at; i >= 0 {
		return s.groups[s.scope.kg].ents[i].val, true
	}
	var zero V
	return zero, false
}

// group returns the current key group, made if missing.
func (s *keyedStore[K, V]) group() *keyGroupMap[K, V] {
	g := s.groups[s.scope.kg]
	if g == nil {
		g = &keyGroupMap[K, V]{}
		s.groups[s.scope.kg] = g
	}
	return g
}

// unshare copies g's entries if a snapshot still owns them, so that they
// can change.
func (s *keyedStore[K, V]) unshare(g *keyGroupMap[K, V]) {
	if !g.shared {
		return
	}
	ents := make([]stateEntry[K, V], len(g.ents), len(g.ents)+len(g.ents)/4+1)
	copy(ents, g.ents)
	if s.clone != nil {
		// Every value is the snapshot's until written (cloneAt).
		n := (len(ents) + 63) / 64
		g.sharedVals = append(g.sharedVals[:0], make([]uint64, n)...)
		for w := range g.sharedVals {
			g.sharedVals[w] = ^uint64(0)
		}
		if r := len(ents) % 64; r != 0 {
			g.sharedVals[n-1] = 1<<uint(r) - 1
		}
	}
	g.ents, g.shared = ents, false
}

// cloneAt makes the value at i g's own, if a snapshot shares it.
func (s *keyedStore[K, V]) cloneAt(g *keyGroupMap[K, V], i int32) {
	if s.clone != nil && g.valShared(i) {
		g.ents[i].val = s.clone(g.ents[i].val)
		g.setValShared(i, false)
	}
}

// getForWrite returns the current key's value, which the caller may change
// in place (a reference value) and then put.
func (s *keyedStore[K, V]) getForWrite() (V, bool) {
	i, ok := s.find()
	if !ok {
		var zero V
		return zero, false
	}
	g := s.groups[s.scope.kg]
	s.unshare(g)
	s.cloneAt(g, i)
	return g.ents[i].val, true
}

func (s *keyedStore[K, V]) put(v V) {
	if s.atGen != s.scope.gen || s.atGen == 0 { // find, inlined
		s.seek()
	}
	i, ok := s.at, s.at >= 0
	if ok && s.clone == nil && s.empty == nil {
		// A plain value (a ValueState's): set it in place.
		g := s.groups[s.scope.kg]
		if g.shared {
			s.unshare(g)
		}
		g.ents[i].val = v
		return
	}
	s.putSlow(v, i, ok)
}

// putSlow is put of a new key, or of a value with copy-on-write marks or
// an empty value; i, ok are the key's position (find).
func (s *keyedStore[K, V]) putSlow(v V, i int32, ok bool) {
	g := s.group()
	if !ok {
		if s.empty != nil {
			if s.empty(v) {
				return // no value: no entry
			}
			if len(g.ents) >= g.sweepAt {
				s.sweepEmpties(g, s.scope.kg)
			}
		}
		i = int32(len(g.ents))
		key := ownKey(s.scope.key)
		s.scope.key = key
		s.index(key, s.scope.kg, i)
		g.ents = append(g.ents, stateEntry[K, V]{key: key, val: v})
		s.at, s.atGen = i, s.scope.gen
		return
	}
	s.unshare(g)
	g.ents[i].val = v
	if s.clone != nil {
		// v is the caller's (getForWrite's own copy, or a new value).
		g.setValShared(i, false)
	}
	if s.empty != nil && len(g.idle) > 0 {
		g.idle = setBit(g.idle, i, false) // set since the last sweep
	}
}

// sweepEmpties drops g's entries that were empty at the last sweep and
// have not been set since (keys that did not come back), keeping the
// order of the others, and marks the entries empty now for the next
// sweep. It runs when a new key would make g reach sweepAt, half as long
// again as the last sweep left it (at least 8 more), so that a key
// without value goes by the second sweep after it went empty, and a
// sweep's cost (the length) is spread over the new keys since the last
// one. A key that comes back between two sweeps is not swept. The current
// key's position is looked up again. g is key group kg.
func (s *keyedStore[K, V]) sweepEmpties(g *keyGroupMap[K, V], kg int) {
	s.unshare(g)
	var idle []uint64
	n := int32(0)
	for i := range g.ents {
		e := g.ents[i]
		empty := s.empty(e.val)
		if empty && bit(g.idle, int32(i)) {
			delete(s.idx, e.key)
			continue
		}
		if n != int32(i) {
			g.ents[n] = e
			s.index(e.key, kg, n)
			if s.clone != nil {
				g.setValShared(n, g.valShared(int32(i)))
			}
		}
		if empty {
			idle = setBit(idle, n, true)
		}
		n++
	}
	clear(g.ents[n:])
	if s.clone != nil {
		for i := n; i < int32(len(g.ents)); i++ {
			g.setValShared(i, false)
		}
	}
	g.ents, g.idle, g.sweepAt = g.ents[:n], idle, int(n)+max(8, int(n)/2)
	s.atGen = 0
}

// ownKey returns a string key as a copy of its own, any other key as it
// is. A key's first record often holds it as a slice of a larger string
// (a word of its line): the store keeps the key for as long as the key has
// state, and would keep the whole line with it, each key's bytes in
// another line's memory. Copies of the keys are allocated one after the
// other, and are the store's only: a lookup compares the record's key
// with them (memory that stays in the cache), a timer's key (the scope's,
// which find sets to the stored copy) compares by pointer.
func ownKey[K comparable](k K) K {
	var zero K
	if _, ok := any(zero).(string); !ok {
		return k // (no boxing of k: a zero value boxes without allocating)
	}
	s, _ := any(k).(string)
	k, _ = any(strings.Clone(s)).(K)
	return k
}

func (s *keyedStore[K, V]) del() {
	i, ok := s.find()
	if !ok {
		return
	}
	g := s.groups[s.scope.kg]
	s.unshare(g)
	last := int32(len(g.ents) - 1)
	if i != last {
		g.ents[i] = g.ents[last]
		s.index(g.ents[i].key, s.scope.kg, i)
		if s.clone != nil {
			g.setValShared(i, g.valShared(last))
		}
		if len(g.idle) > 0 {
			g.idle = setBit(g.idle, i, bit(g.idle, last))
		}
	}
	if len(g.idle) > 0 {
		g.idle = setBit(g.idle, last, false)
	}
	if s.clone != nil {
		g.setValShared(last, false)
	}
	g.ents[last] = stateEntry[K, V]{}
	g.ents = g.ents[:last]
	delete(s.idx, s.scope.key)
	s.at = -1
}

func (s *keyedStore[K, V]) close() error { return nil }

func (s *keyedStore[K, V]) freeze() frozenState {
	f := &frozenStore[K, V]{s: s, groups: make(map[int][]stateEntry[K, V], len(s.groups))}
	for kg, g := range s.groups {
		if g == nil || len(g.ents) == 0 {
			continue
		}
		g.shared = true
		f.groups[kg] = g.ents[:len(g.ents):len(g.ents)]
	}
	if s.filter != nil {
		f.keep = s.filter()
	}
	return f
}

// frozenStore is a keyedStore's entries at a snapshot (shared with the
// store, copy-on-write).
type frozenStore[K comparable, V any] struct {
	s      *keyedStore[K, V] // for its codecs and empty only
	groups map[int][]stateEntry[K, V]
	// keep, if set, maps each value to what the snapshot writes or drops
	// it (keyedStore.filter); kept holds a key group's kept entries.
	keep   func(V) (V, bool)
	kept   []stateEntry[K, V]
	kb, vb []byte
}

func (f *frozenStore[K, V]) keyGroups() ([]int, error) {
	return slices.Collect(maps.Keys(f.groups)), nil
}

func (f *frozenStore[K, V]) appendKeyGroup(b []byte, kg int) ([]byte, bool, error) {
	ents, ok := f.groups[kg]
	if !ok {
		return b, false, nil
	}
	if f.keep != nil {
		f.kept = f.kept[:0]
		for _, e := range ents {
			if v, ok := f.keep(e.val); ok {
				f.kept = append(f.kept, stateEntry[K, V]{key: e.key, val: v})
			}
		}
		clear(f.kept[len(f.kept):cap(f.kept)])
		if ents = f.kept; len(ents) == 0 {
			return b, false, nil
		}
	}
	n := len(ents)
	if f.s.empty != nil {
		for _, e := range ents {
			if f.s.empty(e.val) {
				n--
			}
		}
		if n == 0 {
			return b, false, nil
		}
	}
	b = binary.AppendUvarint(b, uint64(n))
	for _, e := range ents {
		if n != len(ents) && f.s.empty(e.val) {
			continue // a key without value, kept for its return
		}
		f.kb = f.s.keyCodec.Append(f.kb[:0], e.key)
		f.vb = f.s.valCodec.Append(f.vb[:0], e.val)
		b = appendFrame(b, f.kb)
		b = appendFrame(b, f.vb)
	}
	return b, true, nil
}

func (s *keyedStore[K, V]) restore(kg int, b []byte) error {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return fmt.Errorf("state %q key group %d: %w: bad entry count", s.stateName, kg, ErrDecode)
	}
	b = b[k:]
	if n > uint64(len(b)) { // every entry takes at least two bytes
		return fmt.Errorf("state %q key group %d: %w: entry count %d", s.stateName, kg, ErrDecode, n)
	}
	if old := s.groups[kg]; old != nil { // restored again: the new entries replace it
		for _, e := range old.ents {
			delete(s.idx, e.key)
		}
		s.groups[kg] = nil
		s.atGen = 0
	}
	if s.idx == nil {
		s.idx = make(map[K]keyPos, n)
	}
	g := &keyGroupMap[K, V]{ents: make([]stateEntry[K, V], 0, n)}
	for i := uint64(0); i < n; i++ {
		var kb, vb []byte
		var err error
		if kb, b, err = readFrame(b); err != nil {
			return fmt.Errorf("state %q key group %d: %w", s.stateName, kg, err)
		}
		if vb, b, err = readFrame(b); err != nil {
			return fmt.Errorf("state %q key group %d: %w", s.stateName, kg, err)
		}
		key, err := s.keyCodec.Decode(kb)
		if err != nil {
			return fmt.Errorf("state %q key group %d key: %w", s.stateName, kg, err)
		}
		val, err := s.valCodec.Decode(vb)
		if err != nil {
			return fmt.Errorf("state %q key group %d value: %w", s.stateName, kg, err)
		}
		if i, dup := s.lookup(key, kg); dup {
			g.ents[i].val = val
			continue
		}
		if s.empty != nil && s.empty(val) {
			continue // no value: no entry
		}
		s.index(key, kg, int32(len(g.ents)))
		g.ents = append(g.ents, stateEntry[K, V]{key: key, val: val})
	}
	s.groups[kg] = g
	return nil
}

// keyedBackend is the keyed state of one keyed operator subtask: the current
// key scope, its named states, and what was restored for states not yet
// registered.
type keyedBackend[K comparable] struct {
	maxPar   int
	scope    keyScope[K]
	timers   *timerHost[K]
	keyCodec Codec[K]
	states   []stateSnapshotter
	restored map[string]map[int][]byte // state name -> key group -> bytes
	// pebble is the subtask's pebble instance (nil: the heap backend),
	// pkey the current key encoded for it.
	pebble *pebbleState
	pkey   *pebbleKey[K]
}

// usePebble puts the states declared from now on in p.
func (b *keyedBackend[K]) usePebble(p *pebbleState) {
	b.pebble, b.pkey = p, &pebbleKey[K]{scope: &b.scope, codec: b.keyCodec}
}

// close releases the states and the pebble instance.
func (b *keyedBackend[K]) close() error {
	var errs []error
	for _, s := range b.states {
		errs = append(errs, s.close())
	}
	if b.pebble != nil {
		errs = append(errs, b.pebble.close())
	}
	return errors.Join(errs...)
}

func newKeyedBackend[K comparable](kc Codec[K], maxPar int) *keyedBackend[K] {
	b := &keyedBackend[K]{keyCodec: kc, maxPar: maxPar, restored: map[string]map[int][]byte{}}
	b.timers = &timerHost[K]{scope: &b.scope, watermark: MinWatermark, clock: time.Now}
	return b
}

func (b *keyedBackend[K]) register(s stateSnapshotter) error {
	for _, o := range b.states {
		if o.name() == s.name() {
			return fmt.Errorf("state %q registered twice", s.name())
		}
	}
	if err := b.checkKind(s.name()); err != nil {
		return err
	}
	b.states = append(b.states, s)
	for kg, blob := range b.restored[s.name()] {
		if err := s.restore(kg, blob); err != nil {
			return err
		}
	}
	delete(b.restored, s.name())
	return nil
}

// snapshot freezes every state and returns the encoder of the key-group
// blobs (combineFrozen). Each key group's blob holds every state of the
// operator.
func (b *keyedBackend[K]) snapshot() func() (map[int][]byte, error) {
	frozen, names, carried := b.freeze()
	return func() (map[int][]byte, error) { return combineFrozen(frozen, names, carried) }
}

// encoder freezes every state and returns what encodes the key-group
// blobs one at a time into a reused buffer (encodeFrozen), for
// checkpoint.OperatorSnapshot.Encode: the checkpoint's upload writes each
// blob as it is encoded, so the task never holds its encoded snapshot. A
// panic of a codec is returned as a *panicError.
func (b *keyedBackend[K]) encoder() func(yield func(kg int, blob []byte) error) error {
	frozen, names, carried := b.freeze()
	return func(yield func(int, []byte) error) (err error) {
		defer recoverInto(&err)
		return encodeFrozen(frozen, names, carried, yield)
	}
}

// freeze freezes every state (the synchronous part of a snapshot).
func (b *keyedBackend[K]) freeze() (frozen []frozenState, names []string, carried map[string]map[int][]byte) {
	frozen = make([]frozenState, len(b.states))
	names = make([]string, len(b.states))
	for i, s := range b.states {
		frozen[i] = s.freeze()
		names[i] = s.name()
	}
	// State restored but never registered again (the job stopped using it)
	// is carried along so a later version can still read it.
	return frozen, names, b.restored
}

// combineFrozen encodes the key-group blobs of frozen states (named by
// names) and of the carried ones, each kept at its exact size.
func combineFrozen(frozen []frozenState, names []string, carried map[string]map[int][]byte) (map[int][]byte, error) {
	perKG := map[int][]byte{}
	err := encodeFrozen(frozen, names, carried, func(kg int, blob []byte) error {
		perKG[kg] = append(make([]byte, 0, len(blob)), blob...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return perKG, nil
}

// encodeFrozen encodes the key-group blobs of frozen states (named by
// names) and of the carried ones in increasing key-group order, each in
// the same reused buffer, and calls yield with each (not with a key group
// whose entries TTL dropped every one of), returning its first error.
func encodeFrozen(frozen []frozenState, names []string, carried map[string]map[int][]byte, yield func(kg int, blob []byte) error) error {
	kgSet := map[int]struct{}{}
	var errs []error
	for i, f := range frozen {
		kgs, err := f.keyGroups()
		if err != nil {
			errs = append(errs, fmt.Errorf("state %q: %w", names[i], err))
			continue
		}
		for _, kg := range kgs {
			kgSet[kg] = struct{}{}
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	cn := make([]string, 0, len(carried))
	for n, blobs := range carried {
		cn = append(cn, n)
		for kg := range blobs {
			kgSet[kg] = struct{}{}
		}
	}
	sort.Strings(cn)
	var buf, blob []byte
	for _, kg := range slices.Sorted(maps.Keys(kgSet)) {
		buf = buf[:0]
		for i, f := range frozen {
			var ok bool
			var err error
			if blob, ok, err = f.appendKeyGroup(blob[:0], kg); err != nil {
				return fmt.Errorf("state %q key group %d: %w", names[i], kg, err)
			} else if ok {
				buf = appendFrame(buf, []byte(names[i]))
				buf = appendFrame(buf, blob)
			}
		}
		for _, n := range cn {
			if blob, ok := carried[n][kg]; ok {
				buf = appendFrame(buf, []byte(n))
				buf = appendFrame(buf, blob)
			}
		}
		if len(buf) == 0 { // TTL dropped every entry
			continue
		}
		if err := yield(kg, buf); err != nil {
			return err
		}
	}
	return nil
}

// restoreKeyGroup splits a key-group blob into its states.
func (b *keyedBackend[K]) restoreKeyGroup(kg int, blob []byte) error {
	for len(blob) > 0 {
		name, rest, err := readFrame(blob)
		if err != nil {
			return fmt.Errorf("key group %d: %w", kg, err)
		}
		data, rest, err := readFrame(rest)
		if err != nil {
			return fmt.Errorf("key group %d: %w", kg, err)
		}
		blob = rest
		m := b.restored[string(name)]
		if m == nil {
			m = map[int][]byte{}
			b.restored[string(name)] = m
		}
		m[kg] = data
	}
	return nil
}

// StateRegistry declares the keyed state of a keyed process function. It is
// handed to KeyedProcessFunction.Open.
type StateRegistry[K comparable] struct {
	b  *keyedBackend[K]
	oc *OperatorContext
}

// Metrics is where the keyed function registers its own metrics (e.g. a
// window operator's late records sent to a side output); see
// OperatorContext.Metrics.
func (r *StateRegistry[K]) Metrics() Metrics { return r.oc.Metrics() }

// NewValueState declares a ValueState named name with codec c (nil: DefaultCodec).
// Declaring the same name twice is an error. Options: WithTTL.
func NewValueState[T any, K comparable](r *StateRegistry[K], name string, c Codec[T], opts ...StateOpt) (*ValueState[T], error) {
	if c == nil {
		if err := CheckDefaultCodec[T](); err != nil {
			return nil, Unrecoverable(fmt.Errorf("state %q: %w", name, err))
		}
		c = DefaultCodec[T]()
	}
	if cfg := stateCfgOf(opts); cfg.ttl != nil {
		return newTTLValueState[T](r, "", name, c, *cfg.ttl)
	}
	return newValueState[T](r, name, c)
}

// newValueState declares a value state stored under name.
func newValueState[T any, K comparable](r *StateRegistry[K], name string, c Codec[T]) (*ValueState[T], error) {
	if p := r.b.pebble; p != nil {
		s := &pebbleValue[K, T]{st: p, stateName: name, sid: p.stateID(name, pebbleKindValue), key: r.b.pkey, codec: c,
			cache:       map[K]valueCacheEntry[T]{},
			stateDumper: &keyedStore[K, T]{stateName: name, keyCodec: r.b.keyCodec, valCodec: c}}
		if err := r.b.register(s); err != nil {
			return nil, err
		}
		p.caches = append(p.caches, s)
		return &ValueState[T]{s: s}, nil
	}
	s := &keyedStore[K, T]{stateName: name, scope: &r.b.scope, groups: make([]*keyGroupMap[K, T], r.b.maxPar), keyCodec: r.b.keyCodec, valCodec: c}
	if err := r.b.register(s); err != nil {
		return nil, err
	}
	return &ValueState[T]{s: s}, nil
}

// NewMapState declares a MapState named name with codecs for its keys and values
// (nil: DefaultCodec). Options: WithTTL (a time-to-live per entry).
func NewMapState[UK comparable, UV any, K comparable](r *StateRegistry[K], name string, kc Codec[UK], vc Codec[UV], opts ...StateOpt) (*MapState[UK, UV], error) {
	if kc == nil {
		if err := CheckDefaultCodec[UK](); err != nil {
			return nil, Unrecoverable(fmt.Errorf("map state %q keys: %w", name, err))
		}
		kc = DefaultCodec[UK]()
	}
	if vc == nil {
		if err := CheckDefaultCodec[UV](); err != nil {
			return nil, Unrecoverable(fmt.Errorf("map state %q values: %w", name, err))
		}
		vc = DefaultCodec[UV]()
	}
	if cfg := stateCfgOf(opts); cfg.ttl != nil {
		return newTTLMapState[UK, UV](r, name, kc, vc, *cfg.ttl)
	}
	return newMapState[UK, UV](r, name, kc, vc)
}

// newMapState declares a map state stored under name.
func newMapState[UK comparable, UV any, K comparable](r *StateRegistry[K], name string, kc Codec[UK], vc Codec[UV]) (*MapState[UK, UV], error) {
	if p := r.b.pebble; p != nil {
		s := &pebbleMap[K, UK, UV]{st: p, stateName: name, sid: p.stateID(name, pebbleKindMap), key: r.b.pkey, kc: kc, vc: vc,
			stateDumper: &keyedStore[K, map[UK]UV]{stateName: name, keyCodec: r.b.keyCodec, valCodec: mapCodec[UK, UV]{kc, vc}, entries: mapEntries[UK, UV]}}
		if err := r.b.register(s); err != nil {
			return nil, err
		}
		s.withCache()
		return &MapState[UK, UV]{s: s}, nil
	}
	s := &keyedStore[K, map[UK]UV]{
		stateName: name, scope: &r.b.scope, groups: make([]*keyGroupMap[K, map[UK]UV], r.b.maxPar),
		keyCodec: r.b.keyCodec, valCodec: mapCodec[UK, UV]{kc, vc},
		clone: func(m map[UK]UV) map[UK]UV {
			c := make(map[UK]UV, len(m))
			for k, v := range m {
				c[k] = v
			}
			return c
		},
		entries: mapEntries[UK, UV],
	}
	if err := r.b.register(s); err != nil {
		return nil, err
	}
	return &MapState[UK, UV]{s: heapMap[K, UK, UV]{s}}, nil
}

// mapEntries calls fn for each entry of m (keyedStore.entries).
func mapEntries[UK comparable, UV any](m map[UK]UV, fn func(k, v any) error) error {
	for k, v := range m {
		if err := fn(k, v); err != nil {
			return err
		}
	}
	return nil
}

// mapCodec encodes a map as a count and framed key/value pairs.
type mapCodec[UK comparable, UV any] struct {
	kc Codec[UK]
	vc Codec[UV]
}

func (c mapCodec[UK, UV]) Append(dst []byte, m map[UK]UV) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(m)))
	var buf []byte
	for k, v := range m {
		buf = c.kc.Append(buf[:0], k)
		dst = appendFrame(dst, buf)
		buf = c.vc.Append(buf[:0], v)
		dst = appendFrame(dst, buf)
	}
	return dst
}

func (c mapCodec[UK, UV]) Decode(b []byte) (map[UK]UV, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return nil, fmt.Errorf("%w: map count", ErrDecode)
	}
	b = b[k:]
	m := make(map[UK]UV, n)
	for i := uint64(0); i < n; i++ {
		kb, rest, err := readFrame(b)
		if err != nil {
			return nil, err
		}
		vb, rest, err := readFrame(rest)
		if err != nil {
			return nil, err
		}
		b = rest
		key, err := c.kc.Decode(kb)
		if err != nil {
			return nil, err
		}
		val, err := c.vc.Decode(vb)
		if err != nil {
			return nil, err
		}
		m[key] = val
	}
	return m, nil
}
