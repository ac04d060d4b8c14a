package runtime

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// The pebble state backend: the keyed state and timers of one keyed
// operator subtask in one pebble instance of its own, under the task
// manager's state directory (StateMemory), removed when the subtask ends.
//
// One instance per keyed operator subtask, not one per task manager, as
// Flink keeps one RocksDB per keyed operator subtask: with the key group
// first in every pebble key, a key group of the subtask is one contiguous
// key range holding every state of the operator and nothing of another
// operator, so a snapshot, a restore or a rescale works on ranges of one
// instance (and an instance is dropped whole when its subtask ends). What
// the instances of a task manager share is the memory budget: one block
// cache and a memtable size derived from it (StateMemory).
//
// Key layout (big endian):
//
//	key group (2 bytes) | state id (2 bytes) | rest
//
// where the state id numbers the operator's declared states (and each time
// domain of each timer service) in this instance, and rest is
//   - value state: the encoded key, framed (uvarint length, bytes);
//   - map state: the framed encoded key, then the encoded user key (one
//     pebble key per entry: a Put never rewrites the key's other entries,
//     and Range is a range scan over the key's prefix);
//   - timers: the timestamp (8 bytes, sign bit flipped so that byte order
//     is time order), then the owner (framed key and namespace); only the
//     earliest timers of each key group are cached in memory.
//
// Snapshots are full and canonical: the synchronous part takes a pebble
// snapshot, the asynchronous part scans it key group by key group and
// encodes the same blobs the heap backend writes, so savepoints, state
// dumps and restores at any parallelism do not depend on the backend.
// Restore writes the decoded key groups of the subtask into the fresh
// instance in batches.

// StateBackendKind names where a job's keyed state and timers live.
type StateBackendKind string

const (
	// HeapState keeps keyed state on the Go heap (the default): fastest,
	// bounded by the memory of the process.
	HeapState StateBackendKind = "heap"
	// PebbleState keeps keyed state in pebble on the task manager's disk,
	// its memory bounded by the task manager's StateMemory budget.
	PebbleState StateBackendKind = "pebble"
)

// ErrBadStateBackend is wrapped by errors about an unknown state backend.
var ErrBadStateBackend = errors.New("unknown state backend")

// ParseStateBackend parses "heap" or "pebble" ("" is heap).
func ParseStateBackend(s string) (StateBackendKind, error) {
	switch StateBackendKind(s) {
	case "", HeapState:
		return HeapState, nil
	case PebbleState:
		return PebbleState, nil
	}
	return "", fmt.Errorf("%w %q: want heap or pebble", ErrBadStateBackend, s)
}

// StateBackend sets where the job's keyed state and timers live (default
// HeapState). Checkpoints and savepoints are the same format on both: a
// job restores from either.
func StateBackend(k StateBackendKind) JobOpt {
	return jobOpt(func(j *Job) { j.stateBackend = k })
}

// StateBackendOf is the state backend the job asked for.
func (j *Job) StateBackendOf() StateBackendKind {
	if j.stateBackend == "" {
		return HeapState
	}
	return j.stateBackend
}

// pebbleState is the pebble instance of one keyed operator subtask.
type pebbleState struct {
	mem    *StateMemory
	db     *pebble.DB
	dir    string
	maxPar int
	nextID uint16
	// infos describes the states by id, for native snapshots (their
	// meta) and native restores (a state declared again keeps its id).
	infos map[uint16]*pebbleStateInfo
	// kgLo, kgHi are the key groups [kgLo, kgHi) the instance holds.
	kgLo, kgHi int
	// memTable is the instance's memtable size (StateMemory.memTableSize).
	memTable uint64
	// restoredNext are lists' next sequence numbers restored from native
	// snapshots, by id; native: the instance was opened on them.
	restoredNext map[uint16]uint64
	native       bool
	// caches are the write-back caches of the instance's states (task
	// goroutine only; pebbleValue, pebbleMap): writeBack writes them before every
	// snapshot. cached is the bytes they are charged, cacheLimit their
	// bound.
	caches     []stateCache
	cached     int
	cacheLimit int
	// dirtyMax caps dirtyLimit in bytes (maxDirtyBytes).
	dirtyMax int
	// chunk is the most a stateBatch holds before it commits, in pebble's
	// accounting: an eighth of a memtable.
	chunk uint64
	// dirty bounds the bytes of the caches' dirty entries: it grows as
	// entries turn dirty, is not lowered when a dirty entry is evicted or
	// forgotten, and is zeroed by writeBack. Past dirtyLimit the task
	// writes the dirty entries back (dirtied), so that a
	// checkpoint's synchronous write-back commits at most that many
	// bytes, however large the state and however long since the last
	// checkpoint.
	dirty int

	mu      sync.Mutex
	closed  bool
	snaps   map[*pebble.Snapshot]struct{} // taken, not released
	staging map[string]struct{}           // native snapshots' directories not released
	running sync.WaitGroup                // asynchronous snapshot parts running
}

// errStateClosed is returned by a snapshot whose backend closed first.
var errStateClosed = errors.New("pebble state backend closed")

// stateID is the id of the state name of kind: the id a native restore
// recorded for it, or a new one.
func (p *pebbleState) stateID(name, kind string) uint16 {
	for id, in := range p.infos {
		if in.Name == name && in.Kind == kind && !in.declared {
			in.declared = true
			return id
		}
	}
	for {
		id := p.nextID
		p.nextID++
		if _, used := p.infos[id]; !used {
			if p.infos == nil {
				p.infos = map[uint16]*pebbleStateInfo{}
			}
			p.infos[id] = &pebbleStateInfo{ID: id, Name: name, Kind: kind, declared: true}
			return id
		}
	}
}

// dirtyShare is the share of an instance's cache bound its caches' dirty
// entries may reach before the task writes them back, and maxDirtyBytes
// the most they may reach whatever the bound: the most a checkpoint's
// synchronous part writes back is dirtyLimit. The cap keeps the barrier's
// write-back short at large budgets (a 3 GiB budget over two slots gives
// each instance a 256 MiB cache bound, whose eighth took seconds to commit
// on a loaded machine: docs/guide/state-backends.md).
const (
	dirtyShare    = 8
	maxDirtyBytes = 8 << 20
)

// dirtyLimit is the bytes of dirty entries past which the task writes
// them back (dirtied): cacheLimit/dirtyShare, at most dirtyMax.
func (p *pebbleState) dirtyLimit() int { return min(p.cacheLimit/dirtyShare, p.dirtyMax) }

// stateCache is a state's write-back cache.
type stateCache interface {
	// writeBack adds the dirty entries to b, keeping them cached. The
	// cache finds them in a list of the keys turned dirty since its last
	// writeBack, which it empties: the work is the dirty entries', not
	// the cache's.
	writeBack(b *stateBatch) error
	// evict drops about a quarter of the cache, adding the dirty entries
	// it drops to b.
	evict(b *stateBatch) error
}

// writeBack writes the states' cached writes to pebble (in chunks:
// stateBatch), so that a pebble snapshot or checkpoint taken next holds
// every write made before it.
func (p *pebbleState) writeBack() error {
	if len(p.caches) == 0 {
		return nil
	}
	b := p.newBatch()
	defer b.close()
	for _, c := range p.caches {
		if err := c.writeBack(b); err != nil {
			return err
		}
	}
	p.dirty = 0
	if err := b.commit(); err != nil {
		return fmt.Errorf("write back cached state: %w", err)
	}
	return nil
}

// dirtied adds d bytes to the dirty bytes' bound (pebbleState.dirty) and
// writes the dirty entries back once it passes dirtyLimit. Called last in
// an access, as makeRoom: the write-back keeps the entries cached.
func (p *pebbleState) dirtied(d int) {
	p.dirty += d
	if p.dirty <= p.dirtyLimit() {
		return
	}
	if err := p.writeBack(); err != nil {
		panic(fmt.Errorf("pebble state: %w", err))
	}
}

// writeNow commits what write puts in a batch at once; a failure fails
// state name's task (p.fail), as a failed state access does. It is how a
// cache writes outside a snapshot's or an eviction's batch (turned off,
// or one key dropped).
func (p *pebbleState) writeNow(name string, write func(*stateBatch) error) {
	b := p.newBatch()
	defer b.close()
	err := write(b)
	if err == nil {
		err = b.commit()
	}
	if err != nil {
		p.fail(name, err)
	}
}

// makeRoom evicts from the states' caches until they are under 3/4 of
// their bound, writing what they drop that pebble lacks in one batch.
func (p *pebbleState) makeRoom() {
	b := p.newBatch()
	defer b.close()
	for i := 0; p.cached > p.cacheLimit*3/4; i++ {
		before := p.cached
		for _, c := range p.caches {
			if err := c.evict(b); err != nil {
				panic(fmt.Errorf("pebble state: %w", err))
			}
		}
		if p.cached == before {
			break
		}
	}
	if err := b.commit(); err != nil {
		panic(fmt.Errorf("pebble state: write evicted cache entries: %w", err))
	}
}

// snapshot takes a pebble snapshot for the asynchronous part of a
// checkpoint; release it with done.
func (p *pebbleState) snapshot() *pebble.Snapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.db.NewSnapshot()
	p.snaps[s] = struct{}{}
	return s
}

// begin starts the asynchronous part that reads s; false if the instance
// closed (s is released then).
func (p *pebbleState) begin(s *pebble.Snapshot) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.running.Add(1)
	return true
}

// done releases s after the asynchronous part that read it.
func (p *pebbleState) done(s *pebble.Snapshot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.snaps[s]; ok {
		delete(p.snaps, s)
		_ = s.Close()
	}
	p.running.Done()
}

// close waits for running snapshot parts, releases the snapshots nobody
// will read (a declined checkpoint), closes the instance and removes its
// files.
func (p *pebbleState) close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.running.Wait()
	p.mu.Lock()
	for s := range p.snaps {
		_ = s.Close()
	}
	p.snaps = nil
	staging := p.staging
	p.staging = nil
	p.mu.Unlock()
	err := p.db.Close()
	p.mem.forget(p)
	if rerr := removeAll(p.mem.fs, p.dir); rerr != nil {
		err = errors.Join(err, rerr)
	}
	for dir := range staging {
		if rerr := removeAll(p.mem.fs, dir); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}
	if err != nil {
		return fmt.Errorf("close pebble state %s: %w", p.dir, err)
	}
	return nil
}

// diskUsage is the instance's size on disk in bytes.
func (p *pebbleState) diskUsage() uint64 { return p.db.Metrics().DiskSpaceUsage() }

// removeAll removes dir and what it holds from fs.
func removeAll(fs vfs.FS, dir string) error {
	if err := fs.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// fail is how a state access that cannot return an error reports one (a
// pebble I/O error, a value its codec cannot decode): a panic the task
// turns into a task failure, so the job restarts from its checkpoint.
func (p *pebbleState) fail(state string, err error) {
	panic(fmt.Errorf("pebble state %q: %w", state, err))
}

// appendStatePrefix appends the key group and state id of a pebble key.
func appendStatePrefix(dst []byte, kg int, sid uint16) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(kg))
	return binary.BigEndian.AppendUint16(dst, sid)
}

// prefixEnd is the first key after every key that starts with p.
func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		end[i]++
		if end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil // p is all 0xff: no upper bound
}

// pebbleKey is the current key encoded once per record for every state of
// the subtask: framed (uvarint length, codec bytes).
type pebbleKey[K comparable] struct {
	scope *keyScope[K]
	codec Codec[K]
	gen   uint64
	buf   []byte
	enc   []byte
}

func (k *pebbleKey[K]) current() []byte {
	if k.gen != k.scope.gen || k.gen == 0 {
		k.buf = k.codec.Append(k.buf[:0], k.scope.key)
		k.enc = appendFrame(k.enc[:0], k.buf)
		k.gen = k.scope.gen
	}
	return k.enc
}

// eachKeyGroup scans the entries of state sid in every key group of s,
// key group by key group, calling fn with each entry's key after the
// state prefix and its value (valid until fn returns), then end after each
// non-empty key group.
// pebbleReader is what a canonical encoder reads: a pebble snapshot, or a
// pebble instance opened on a native snapshot's files.
type pebbleReader interface {
	NewIter(*pebble.IterOptions) (*pebble.Iterator, error)
}

func eachKeyGroup(s pebbleReader, maxPar int, sid uint16, fn func(kg int, rest, val []byte) error, end func(kg int) error) error {
	var lo, hi []byte
	for kg := 0; kg < maxPar; kg++ {
		lo = appendStatePrefix(lo[:0], kg, sid)
		hi = appendStatePrefix(hi[:0], kg, sid+1)
		if sid == 0xffff {
			hi = appendStatePrefix(hi[:0], kg+1, 0)
		}
		it, err := s.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if err != nil {
			return err
		}
		any := false
		for ok := it.First(); ok; ok = it.Next() {
			v, err := it.ValueAndErr()
			if err != nil {
				_ = it.Close()
				return err
			}
			any = true
			if err := fn(kg, it.Key()[4:], v); err != nil {
				_ = it.Close()
				return err
			}
		}
		if err := it.Close(); err != nil {
			return err
		}
		if any {
			if err := end(kg); err != nil {
				return err
			}
		}
	}
	return nil
}

// pebbleValue is a value state in pebble: one pebble key per key.
//
// In front of pebble sits a write-back cache of decoded values (cache): a
// read of a cached key, and a write, touch no pebble key; a write reaches
// pebble when its entry is evicted, or in the synchronous part of the next
// snapshot (pebbleState.writeBack, before pebble's snapshot or checkpoint
// is taken), so that every snapshot holds every write made before its
// barrier. A key that lives and dies between two snapshots (q4's
// auctions) never reaches pebble. The caches of an instance's states share
// a bound in bytes (pebbleState.cacheLimit), each entry charged its
// encoded size plus valueCacheOverhead.
type pebbleValue[K comparable, V any] struct {
	st        *pebbleState
	stateName string
	sid       uint16
	key       *pebbleKey[K]
	codec     Codec[V]
	kbuf      []byte
	vbuf      []byte
	// cache is nil when off (a state with TTL cleanup: its sweep deletes
	// pebble's expired entries).
	cache map[K]valueCacheEntry[V]
	// dirtyKeys lists the keys whose entries turned dirty since the last
	// writeBack (some may have been evicted or written since).
	dirtyKeys []K
	// cached is the bytes cache's entries are charged (their share of
	// st.cached).
	cached int
	stateDumper
}

// valueCacheEntry is a key's value in a pebbleValue's cache.
type valueCacheEntry[V any] struct {
	val  V
	kg   int
	size int // bytes charged to the instance's cache bound
	// present: the key has a value (else it has none: a read that found
	// nothing, or a deleted value); dirty: pebble does not hold it yet;
	// stored: pebble may hold a value for the key (a deletion must be
	// written back).
	present, dirty, stored bool
}

// valueCacheOverhead is what a cached entry is charged beyond its
// encoded value: the map's slot, the decoded value's header, the key.
const valueCacheOverhead = 64

func (s *pebbleValue[K, V]) k() []byte {
	s.kbuf = appendStatePrefix(s.kbuf[:0], s.key.scope.kg, s.sid)
	s.kbuf = append(s.kbuf, s.key.current()...)
	return s.kbuf
}

// keyOf is the pebble key of key k in key group kg.
func (s *pebbleValue[K, V]) keyOf(kg int, k K) []byte {
	s.kbuf = appendStatePrefix(s.kbuf[:0], kg, s.sid)
	s.vbuf = s.key.codec.Append(s.vbuf[:0], k)
	s.kbuf = appendFrame(s.kbuf, s.vbuf)
	return s.kbuf
}

// load reads the current key's value from pebble, and its encoded size.
func (s *pebbleValue[K, V]) load() (V, int, bool) {
	var zero V
	v, c, err := s.st.db.Get(s.k())
	if errors.Is(err, pebble.ErrNotFound) {
		return zero, 0, false
	}
	if err != nil {
		s.st.fail(s.stateName, err)
	}
	x, err := s.codec.Decode(v)
	n := len(v)
	_ = c.Close()
	if err != nil {
		s.st.fail(s.stateName, err)
	}
	return x, n, true
}

func (s *pebbleValue[K, V]) get() (V, bool) {
	if s.cache == nil {
		x, _, ok := s.load()
		return x, ok
	}
	key := s.key.scope.key
	if e, ok := s.cache[key]; ok {
		return e.val, e.present
	}
	x, n, ok := s.load()
	s.set(key, valueCacheEntry[V]{val: x, kg: s.key.scope.kg, size: n + valueCacheOverhead, present: ok, stored: ok})
	return x, ok
}

// set caches e for key, charging the instance's bound the difference
// with what key's entry was charged (old, 0 if none), and makes room if
// the bound is passed; a dirty e is counted in the instance's dirty bytes
// (pebbleState.dirtied).
func (s *pebbleValue[K, V]) set(key K, e valueCacheEntry[V]) {
	old := s.cache[key]
	s.cache[key] = e
	s.charge(e.size - old.size)
	d := 0
	if e.dirty {
		if d = e.size; old.dirty {
			d -= old.size
		} else {
			s.dirtyKeys = append(s.dirtyKeys, key)
		}
	}
	if s.st.cached > s.st.cacheLimit {
		s.st.makeRoom()
	}
	if d != 0 {
		s.st.dirtied(d)
	}
}

func (s *pebbleValue[K, V]) put(v V) {
	s.vbuf = s.codec.Append(s.vbuf[:0], v)
	if s.cache == nil {
		if err := s.st.db.Set(s.k(), s.vbuf, pebble.NoSync); err != nil {
			s.st.fail(s.stateName, err)
		}
		return
	}
	key := s.key.scope.key
	e, ok := s.cache[key]
	if !ok {
		e.stored = true // not known: pebble may hold a value
	}
	e.val, e.kg, e.size, e.present, e.dirty = v, s.key.scope.kg, len(s.vbuf)+valueCacheOverhead, true, true
	s.set(key, e)
}

func (s *pebbleValue[K, V]) del() {
	if s.cache == nil {
		if err := s.st.db.Delete(s.k(), pebble.NoSync); err != nil {
			s.st.fail(s.stateName, err)
		}
		return
	}
	key := s.key.scope.key
	e, ok := s.cache[key]
	if ok && !e.stored {
		// pebble holds nothing for the key: forget it.
		s.charge(-e.size)
		delete(s.cache, key)
		return
	}
	s.set(key, valueCacheEntry[V]{kg: s.key.scope.kg, size: valueCacheOverhead, stored: true, dirty: true})
}

// writeEntry adds e, the cached value of k, to b if pebble lacks it.
func (s *pebbleValue[K, V]) writeEntry(b *stateBatch, k K, e valueCacheEntry[V]) error {
	switch {
	case !e.dirty:
		return nil
	case e.present:
		key := s.keyOf(e.kg, k)
		s.vbuf = s.codec.Append(s.vbuf[:0], e.val)
		return b.Set(key, s.vbuf)
	case e.stored:
		return b.Delete(s.keyOf(e.kg, k))
	}
	return nil
}

// charge adds d bytes to what the cache is charged, and its instance's.
func (s *pebbleValue[K, V]) charge(d int) {
	s.cached += d
	s.st.cached += d
}

// evict drops about a quarter of the cache's bytes (at least one entry),
// adding the dirty ones to b. Which entries go is the map's iteration
// order: no bookkeeping per access.
func (s *pebbleValue[K, V]) evict(b *stateBatch) error {
	goal := s.cached / 4
	for k, e := range s.cache {
		if err := s.writeEntry(b, k, e); err != nil {
			return fmt.Errorf("state %q: %w", s.stateName, err)
		}
		delete(s.cache, k)
		s.charge(-e.size)
		if goal -= e.size; goal <= 0 {
			break
		}
	}
	return nil
}

// writeBack adds the cache's dirty entries to b: they stay cached, clean
// (a deleted key's entry is dropped). Every dirty entry's key is in
// dirtyKeys.
func (s *pebbleValue[K, V]) writeBack(b *stateBatch) error {
	keys := s.dirtyKeys
	s.dirtyKeys = keys[:0]
	defer clear(keys)
	for _, k := range keys {
		e, ok := s.cache[k]
		if !ok || !e.dirty {
			continue
		}
		if err := s.writeEntry(b, k, e); err != nil {
			return fmt.Errorf("state %q: %w", s.stateName, err)
		}
		if !e.present {
			s.charge(-e.size)
			delete(s.cache, k)
			continue
		}
		e.dirty, e.stored = false, true
		s.cache[k] = e
	}
	return nil
}

// noCache turns the cache off (a state with TTL cleanup, whose sweep
// deletes pebble's expired entries).
func (s *pebbleValue[K, V]) noCache() {
	s.st.writeNow(s.stateName, s.writeBack)
	s.charge(-s.cached)
	s.cache, s.dirtyKeys = nil, nil
}

func (s *pebbleValue[K, V]) name() string { return s.stateName }

func (s *pebbleValue[K, V]) close() error { return nil }

// freeze: the rest of a value's pebble key is the framed key, as the
// canonical blob frames it, and the pebble value is the codec's bytes.
func (s *pebbleValue[K, V]) freeze() frozenState {
	if err := s.st.writeBack(); err != nil {
		s.st.fail(s.stateName, err)
	}
	return &frozenBlobs{enc: s.st.encodeLater(s.sid, encodeValueBlobs)}
}

// encodeLater is the synchronous part of a pebble state's full snapshot:
// it takes a pebble snapshot now and returns the asynchronous part, enc
// of state sid over that snapshot.
func (p *pebbleState) encodeLater(sid uint16, enc func(pebbleReader, int, uint16) (map[int][]byte, error)) func() (map[int][]byte, error) {
	snap := p.snapshot()
	return func() (map[int][]byte, error) {
		if !p.begin(snap) {
			return nil, errStateClosed
		}
		defer p.done(snap)
		return enc(snap, p.maxPar, sid)
	}
}

func (s *pebbleValue[K, V]) restore(kg int, blob []byte) error {
	b := s.st.newBatch()
	defer b.close()
	var key []byte
	err := readEntries(blob, func(kb, vb []byte) error {
		key = appendStatePrefix(key[:0], kg, s.sid)
		key = appendFrame(key, kb)
		return b.Set(key, vb)
	})
	if err != nil {
		return fmt.Errorf("state %q key group %d: %w", s.stateName, kg, err)
	}
	if err := b.commit(); err != nil {
		return fmt.Errorf("state %q key group %d: %w", s.stateName, kg, err)
	}
	return nil
}

// encodeValueBlobs encodes value state sid of r as canonical blobs.
func encodeValueBlobs(r pebbleReader, maxPar int, sid uint16) (map[int][]byte, error) {
	out := map[int][]byte{}
	var body []byte
	n := 0
	err := eachKeyGroup(r, maxPar, sid, func(_ int, rest, val []byte) error {
		body = append(body, rest...)
		body = appendFrame(body, val)
		n++
		return nil
	}, func(kg int) error {
		b := binary.AppendUvarint(make([]byte, 0, len(body)+binary.MaxVarintLen64), uint64(n))
		out[kg] = append(b, body...)
		body, n = body[:0], 0
		return nil
	})
	return out, err
}

// pebbleMap is a map state in pebble: one pebble key per entry.
//
// In front of pebble sits a write-back cache of whole keys (cache): the
// first access to a key reads its entries with one range scan, and every
// access after that, read or write, Range, Len and Clear included, works
// on the cached entries alone, so the cache needs no merge with pebble: a
// cached key's entries are all of them. Writes reach pebble as the value
// cache's do (pebbleValue): when the key is evicted, or in the synchronous
// part of the next snapshot (pebbleState.writeBack). A key with more than
// mapCacheEntries entries is not cached (its accesses go to pebble, as
// with the cache off); the window operator's keys hold a few windows. The
// caches of an instance's states share its bound in bytes, each entry
// charged its encoded size plus mapCacheOverhead. Lists (pebbleList) and
// maps with TTL cleanup have the cache off.
type pebbleMap[K comparable, UK comparable, UV any] struct {
	st        *pebbleState
	stateName string
	sid       uint16
	key       *pebbleKey[K]
	kc        Codec[UK]
	vc        Codec[UV]
	pbuf      []byte // prefix of the current key's entries
	kbuf      []byte
	vbuf      []byte
	// cache is nil when off; big holds keys found with too many entries
	// to cache (bounded: emptied when full).
	cache map[K]*mapCacheKey[UK, UV]
	big   map[K]struct{}
	// dirtyKeys lists the keys turned dirty since the last writeBack
	// (some may have been evicted or written since).
	dirtyKeys []K
	cached    int // bytes cache's entries are charged (their share of st.cached)
	stateDumper
}

// mapCacheKey is a key's entries in a pebbleMap's cache: all of them.
type mapCacheKey[UK comparable, UV any] struct {
	kg    int
	ents  []mapCacheEntry[UK, UV]
	size  int  // bytes charged
	dirty bool // some entry is dirty
}

// mapCacheEntry is one entry of a cached key. present: the entry exists
// (else it was removed, and pebble still holds it: a deletion to write
// back); dirty: pebble does not hold it as cached; stored: pebble holds
// an entry for uk.
type mapCacheEntry[UK comparable, UV any] struct {
	uk                     UK
	uv                     UV
	size                   int
	present, dirty, stored bool
}

// mapCacheEntries is the most entries (removed ones included) a cached
// key holds; mapCacheOverhead is what a key and each entry are charged
// beyond their encoded bytes; mapCacheBig bounds pebbleMap.big.
const (
	mapCacheEntries  = 16
	mapCacheOverhead = 48
	mapCacheBig      = 1 << 12
)

// withCache turns m's cache on.
func (m *pebbleMap[K, UK, UV]) withCache() *pebbleMap[K, UK, UV] {
	m.cache = map[K]*mapCacheKey[UK, UV]{}
	m.big = map[K]struct{}{}
	m.st.caches = append(m.st.caches, m)
	return m
}

// cachedKey is the current key's cache entry, read from pebble if it is
// not cached; nil if the cache is off or the key has too many entries.
func (m *pebbleMap[K, UK, UV]) cachedKey() *mapCacheKey[UK, UV] {
	if m.cache == nil {
		return nil
	}
	key := m.key.scope.key
	if c, ok := m.cache[key]; ok {
		return c
	}
	if _, ok := m.big[key]; ok {
		return nil
	}
	c := &mapCacheKey[UK, UV]{kg: m.key.scope.kg, size: mapCacheOverhead}
	big := false
	m.scan(func(ukb, uvb []byte) bool {
		if len(c.ents) == mapCacheEntries {
			big = true
			return false
		}
		uk, err := m.kc.Decode(ukb)
		if err != nil {
			m.st.fail(m.stateName, err)
		}
		uv, err := m.vc.Decode(uvb)
		if err != nil {
			m.st.fail(m.stateName, err)
		}
		n := len(ukb) + len(uvb) + mapCacheOverhead
		c.ents = append(c.ents, mapCacheEntry[UK, UV]{uk: uk, uv: uv, size: n, present: true, stored: true})
		c.size += n
		return true
	})
	if big {
		m.markBig(key)
		return nil
	}
	m.cache[key] = c
	m.charge(c.size)
	return c
}

// markBig records that key is not cached.
func (m *pebbleMap[K, UK, UV]) markBig(key K) {
	if len(m.big) >= mapCacheBig {
		clear(m.big)
	}
	m.big[key] = struct{}{}
}

// find is uk's position in c.
func (c *mapCacheKey[UK, UV]) find(uk UK) int {
	for i := range c.ents {
		if c.ents[i].uk == uk {
			return i
		}
	}
	return -1
}

// charge adds d bytes to what the cache is charged, and its instance's.
func (m *pebbleMap[K, UK, UV]) charge(d int) {
	m.cached += d
	m.st.cached += d
}

// bound makes room in the instance's caches if they passed their bound.
// Called last in an access: an eviction writes what it drops.
func (m *pebbleMap[K, UK, UV]) bound() {
	if m.st.cached > m.st.cacheLimit {
		m.st.makeRoom()
	}
}

// cachedEntry reports whether uk is present for the key in scope, and whether
// the cache knows (it holds the key): it never reads pebble nor evicts.
func (m *pebbleMap[K, UK, UV]) cachedEntry(uk UK) (present, known bool) {
	c, ok := m.cache[m.key.scope.key]
	if !ok {
		return false, false
	}
	i := c.find(uk)
	return i >= 0 && c.ents[i].present, true
}

func (m *pebbleMap[K, UK, UV]) get(uk UK) (UV, bool) {
	if c := m.cachedKey(); c != nil {
		var uv UV
		ok := false
		if i := c.find(uk); i >= 0 && c.ents[i].present {
			uv, ok = c.ents[i].uv, true
		}
		m.bound()
		return uv, ok
	}
	return m.getDirect(uk)
}

func (m *pebbleMap[K, UK, UV]) put(uk UK, uv UV) {
	c := m.cachedKey()
	if c == nil {
		m.putDirect(uk, uv)
		return
	}
	m.vbuf = m.kc.Append(m.vc.Append(m.vbuf[:0], uv), uk)
	n := len(m.vbuf) + mapCacheOverhead
	d := n
	if i := c.find(uk); i >= 0 {
		e := &c.ents[i]
		m.charge(n - e.size)
		c.size += n - e.size
		if e.dirty {
			d -= e.size
		}
		e.uv, e.size, e.present, e.dirty = uv, n, true, true
	} else {
		if len(c.ents) == mapCacheEntries {
			// Too many entries to cache: the key's writes go to pebble.
			m.uncache(m.key.scope.key, c)
			m.putDirect(uk, uv)
			return
		}
		c.ents = append(c.ents, mapCacheEntry[UK, UV]{uk: uk, uv: uv, size: n, present: true, dirty: true})
		c.size += n
		m.charge(n)
	}
	m.turnDirty(c)
	m.bound()
	m.st.dirtied(d)
}

// turnDirty marks c, the current key's entries, dirty, listing the key
// if it was clean.
func (m *pebbleMap[K, UK, UV]) turnDirty(c *mapCacheKey[UK, UV]) {
	if !c.dirty {
		c.dirty = true
		m.dirtyKeys = append(m.dirtyKeys, m.key.scope.key)
	}
}

func (m *pebbleMap[K, UK, UV]) remove(uk UK) {
	c := m.cachedKey()
	if c == nil {
		m.removeDirect(uk)
		return
	}
	d := 0
	if i := c.find(uk); i >= 0 {
		d = m.removeAt(c, i)
	}
	m.bound()
	if d != 0 {
		m.st.dirtied(d)
	}
}

// removeAt removes c's entry i, the current key's: forgotten if pebble
// lacks it, else kept as a deletion to write back. It returns the bytes
// the removal turned dirty.
func (m *pebbleMap[K, UK, UV]) removeAt(c *mapCacheKey[UK, UV], i int) int {
	e := &c.ents[i]
	if !e.stored {
		m.charge(-e.size)
		c.size -= e.size
		c.ents = slices.Delete(c.ents, i, i+1)
		return 0
	}
	d := 0
	if e.present {
		if !e.dirty {
			d = e.size
		}
		var zero UV
		e.uv, e.present, e.dirty = zero, false, true
		m.turnDirty(c)
	}
	return d
}

// uncache writes key's dirty entries to pebble and drops it from the
// cache, marking it big.
func (m *pebbleMap[K, UK, UV]) uncache(key K, c *mapCacheKey[UK, UV]) {
	m.st.writeNow(m.stateName, func(b *stateBatch) error { return m.writeKey(b, key, c) })
	delete(m.cache, key)
	m.charge(-c.size)
	m.markBig(key)
}

func (m *pebbleMap[K, UK, UV]) each(fn func(UK, UV) bool) {
	c := m.cachedKey()
	if c == nil {
		m.eachDirect(fn)
		return
	}
	// Copy first, call fn after: fn may change the state (or another
	// one, evicting this key).
	type entry struct {
		k UK
		v UV
	}
	var buf [mapCacheEntries]entry
	ents := buf[:0]
	for _, e := range c.ents {
		if e.present {
			ents = append(ents, entry{e.uk, e.uv})
		}
	}
	m.bound()
	for _, e := range ents {
		if !fn(e.k, e.v) {
			return
		}
	}
}

func (m *pebbleMap[K, UK, UV]) len() int {
	c := m.cachedKey()
	if c == nil {
		return m.lenDirect()
	}
	n := 0
	for _, e := range c.ents {
		if e.present {
			n++
		}
	}
	m.bound()
	return n
}

func (m *pebbleMap[K, UK, UV]) clear() {
	c := m.cachedKey()
	if c == nil {
		m.clearDirect()
		return
	}
	d := 0
	for i := len(c.ents) - 1; i >= 0; i-- {
		d += m.removeAt(c, i)
	}
	m.bound()
	if d != 0 {
		m.st.dirtied(d)
	}
}

// writeKey adds the dirty entries of c, key's cached entries, to b: they
// stay cached, clean (removed ones are dropped).
func (m *pebbleMap[K, UK, UV]) writeKey(b *stateBatch, key K, c *mapCacheKey[UK, UV]) error {
	if !c.dirty {
		return nil
	}
	m.pbuf = appendStatePrefix(m.pbuf[:0], c.kg, m.sid)
	m.vbuf = m.key.codec.Append(m.vbuf[:0], key)
	m.pbuf = appendFrame(m.pbuf, m.vbuf)
	out := c.ents[:0]
	for _, e := range c.ents {
		if !e.dirty {
			out = append(out, e)
			continue
		}
		m.kbuf = m.kc.Append(append(m.kbuf[:0], m.pbuf...), e.uk)
		if !e.present {
			if err := b.Delete(m.kbuf); err != nil {
				return fmt.Errorf("state %q: %w", m.stateName, err)
			}
			m.charge(-e.size)
			c.size -= e.size
			continue
		}
		m.vbuf = m.vc.Append(m.vbuf[:0], e.uv)
		if err := b.Set(m.kbuf, m.vbuf); err != nil {
			return fmt.Errorf("state %q: %w", m.stateName, err)
		}
		e.dirty, e.stored = false, true
		out = append(out, e)
	}
	clear(c.ents[len(out):])
	c.ents = out
	c.dirty = false
	return nil
}

// writeBack adds the cache's dirty entries to b (stateCache): every
// dirty key is in dirtyKeys.
func (m *pebbleMap[K, UK, UV]) writeBack(b *stateBatch) error {
	keys := m.dirtyKeys
	m.dirtyKeys = keys[:0]
	defer clear(keys)
	for _, k := range keys {
		if c, ok := m.cache[k]; ok {
			if err := m.writeKey(b, k, c); err != nil {
				return err
			}
		}
	}
	return nil
}

// evict drops about a quarter of the cache's bytes (at least one key),
// adding their dirty entries to b (stateCache), in the map's order.
func (m *pebbleMap[K, UK, UV]) evict(b *stateBatch) error {
	goal := m.cached / 4
	for k, c := range m.cache {
		if err := m.writeKey(b, k, c); err != nil {
			return err
		}
		delete(m.cache, k)
		m.charge(-c.size)
		if goal -= c.size; goal <= 0 {
			break
		}
	}
	return nil
}

// noCache turns the cache off (a map with TTL cleanup, whose sweep
// deletes pebble's expired entries).
func (m *pebbleMap[K, UK, UV]) noCache() {
	if m.cache == nil {
		return
	}
	m.st.writeNow(m.stateName, m.writeBack)
	m.charge(-m.cached)
	m.cache, m.big, m.dirtyKeys = nil, nil, nil
	m.st.caches = slices.DeleteFunc(m.st.caches, func(c stateCache) bool { return c == stateCache(m) })
}

// prefix is the current key's entries' prefix.
func (m *pebbleMap[K, UK, UV]) prefix() []byte {
	m.pbuf = appendStatePrefix(m.pbuf[:0], m.key.scope.kg, m.sid)
	m.pbuf = append(m.pbuf, m.key.current()...)
	return m.pbuf
}

func (m *pebbleMap[K, UK, UV]) k(uk UK) []byte {
	m.kbuf = append(m.kbuf[:0], m.prefix()...)
	m.kbuf = m.kc.Append(m.kbuf, uk)
	return m.kbuf
}

func (m *pebbleMap[K, UK, UV]) getDirect(uk UK) (UV, bool) {
	var zero UV
	v, c, err := m.st.db.Get(m.k(uk))
	if errors.Is(err, pebble.ErrNotFound) {
		return zero, false
	}
	if err != nil {
		m.st.fail(m.stateName, err)
	}
	x, err := m.vc.Decode(v)
	_ = c.Close()
	if err != nil {
		m.st.fail(m.stateName, err)
	}
	return x, true
}

func (m *pebbleMap[K, UK, UV]) putDirect(uk UK, uv UV) {
	m.vbuf = m.vc.Append(m.vbuf[:0], uv)
	if err := m.st.db.Set(m.k(uk), m.vbuf, pebble.NoSync); err != nil {
		m.st.fail(m.stateName, err)
	}
}

func (m *pebbleMap[K, UK, UV]) removeDirect(uk UK) {
	if err := m.st.db.Delete(m.k(uk), pebble.NoSync); err != nil {
		m.st.fail(m.stateName, err)
	}
}

// scan calls fn for each entry of the current key: the user key's bytes
// and the value's (valid until fn returns).
func (m *pebbleMap[K, UK, UV]) scan(fn func(uk, uv []byte) bool) {
	p := m.prefix()
	it, err := m.st.db.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: prefixEnd(p)})
	if err != nil {
		m.st.fail(m.stateName, err)
	}
	n := len(p)
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			_ = it.Close()
			m.st.fail(m.stateName, err)
		}
		if !fn(it.Key()[n:], v) {
			break
		}
	}
	if err := it.Close(); err != nil {
		m.st.fail(m.stateName, err)
	}
}

func (m *pebbleMap[K, UK, UV]) eachDirect(fn func(UK, UV) bool) {
	// Decode first, call fn after: fn may read other states (or this
	// one) of the key, and must not see the iterator's buffers.
	type entry struct {
		k UK
		v UV
	}
	var ents []entry
	m.scan(func(ukb, uvb []byte) bool {
		uk, err := m.kc.Decode(ukb)
		if err != nil {
			m.st.fail(m.stateName, err)
		}
		uv, err := m.vc.Decode(uvb)
		if err != nil {
			m.st.fail(m.stateName, err)
		}
		ents = append(ents, entry{uk, uv})
		return true
	})
	for _, e := range ents {
		if !fn(e.k, e.v) {
			return
		}
	}
}

func (m *pebbleMap[K, UK, UV]) lenDirect() int {
	n := 0
	m.scan(func(_, _ []byte) bool { n++; return true })
	return n
}

func (m *pebbleMap[K, UK, UV]) clearDirect() {
	p := m.prefix()
	if err := m.st.db.DeleteRange(p, prefixEnd(p), pebble.NoSync); err != nil {
		m.st.fail(m.stateName, err)
	}
}

func (m *pebbleMap[K, UK, UV]) name() string { return m.stateName }

func (m *pebbleMap[K, UK, UV]) close() error { return nil }

// freeze: the canonical blob of a map state is, per key, the framed key
// and the framed map (count, then framed user keys and values), built
// from the key's consecutive entries without decoding them.
func (m *pebbleMap[K, UK, UV]) freeze() frozenState {
	if err := m.st.writeBack(); err != nil {
		m.st.fail(m.stateName, err)
	}
	return &frozenBlobs{enc: m.st.encodeLater(m.sid, encodeMapBlobs)}
}

// encodeMapBlobs encodes map state sid of r as canonical blobs.
func encodeMapBlobs(r pebbleReader, maxPar int, sid uint16) (map[int][]byte, error) {
	out := map[int][]byte{}
	var body, cur, ents []byte // cur: the framed key of ents
	keys, n := 0, 0
	flush := func() {
		if n == 0 {
			return
		}
		body = append(body, cur...)
		mb := binary.AppendUvarint(nil, uint64(n))
		body = appendFrame(body, append(mb, ents...))
		keys++
		ents, n = ents[:0], 0
	}
	err := eachKeyGroup(r, maxPar, sid, func(_ int, rest, val []byte) error {
		kb, uk, err := readFrame(rest)
		if err != nil {
			return err
		}
		framed := rest[:len(rest)-len(uk)]
		if n > 0 && !bytes.Equal(framed, cur) {
			flush()
		}
		if n == 0 {
			cur = append(cur[:0], framed...)
		}
		_ = kb
		ents = appendFrame(ents, uk)
		ents = appendFrame(ents, val)
		n++
		return nil
	}, func(kg int) error {
		flush()
		b := binary.AppendUvarint(make([]byte, 0, len(body)+binary.MaxVarintLen64), uint64(keys))
		out[kg] = append(b, body...)
		body, keys = body[:0], 0
		return nil
	})
	return out, err
}

func (m *pebbleMap[K, UK, UV]) restore(kg int, blob []byte) error {
	b := m.st.newBatch()
	defer b.close()
	var key []byte
	err := readEntries(blob, func(kb, vb []byte) error {
		key = appendStatePrefix(key[:0], kg, m.sid)
		key = appendFrame(key, kb)
		plen := len(key)
		return readEntries(vb, func(ukb, uvb []byte) error {
			key = append(key[:plen], ukb...)
			return b.Set(key, uvb)
		})
	})
	if err != nil {
		return fmt.Errorf("state %q key group %d: %w", m.stateName, kg, err)
	}
	if err := b.commit(); err != nil {
		return fmt.Errorf("state %q key group %d: %w", m.stateName, kg, err)
	}
	return nil
}

// pebbleTimers is one time domain of one timer service in pebble, ordered
// by time within each key group. Each key group's earliest timers (up to
// timerCacheSize) are cached in memory, as Flink's RocksDB timers keep
// the head of each key group's queue: firing, registering before the
// cached tail and deleting a cached timer need no pebble read; the cache
// is refilled by one range scan when it runs empty.
type pebbleTimers struct {
	st     *pebbleState
	name   string
	sid    uint16
	caches []timerCache // by key group
	min    int          // key group of the earliest timer; -1: none; -2: recompute
	// known holds timers beyond the cached heads that pebble is known to
	// hold (registered), so that registering one again writes nothing.
	// Removing or firing a timer forgets it; full, it is emptied.
	known map[pebbleTimerID]struct{}
	kbuf  []byte
	lo    []byte
	hi    []byte
}

// pebbleTimerID is a timer in pebble: its timestamp and encoded owner.
type pebbleTimerID struct {
	ts    int64
	owner string
}

// less orders timers by timestamp, then by the owner's encoding (pebble's
// key order).
func (a pebbleTimerID) less(b pebbleTimerID) bool {
	if a.ts != b.ts {
		return a.ts < b.ts
	}
	return a.owner < b.owner
}

// timerCacheSize is how many of a key group's earliest timers are cached.
const timerCacheSize = 32

// timerKnownSize bounds pebbleTimers.known.
const timerKnownSize = 1 << 15

// know records that pebble holds timer id.
func (t *pebbleTimers) know(id pebbleTimerID) {
	if len(t.known) >= timerKnownSize {
		clear(t.known)
	}
	t.known[id] = struct{}{}
}

// timerCache is a key group's earliest timers, sorted. complete: they are
// all of the key group's timers; else every timer not cached is after the
// last cached one, and ids is not empty.
type timerCache struct {
	ids      []pebbleTimerID
	complete bool
}

// find is id's position in the cache and whether it is there.
func (c *timerCache) find(id pebbleTimerID) (int, bool) {
	i := sort.Search(len(c.ids), func(i int) bool { return !c.ids[i].less(id) })
	return i, i < len(c.ids) && c.ids[i] == id
}

// covers says whether the cache knows if id exists: every timer up to id
// is cached.
func (c *timerCache) covers(id pebbleTimerID) bool {
	return c.complete || id.less(c.ids[len(c.ids)-1])
}

func newPebbleTimers(st *pebbleState, name, kind string) *pebbleTimers {
	t := &pebbleTimers{st: st, name: name, sid: st.stateID(name, kind), caches: make([]timerCache, st.maxPar), min: -1,
		known: map[pebbleTimerID]struct{}{}}
	for i := range t.caches {
		t.caches[i].complete = true
	}
	if st.native {
		t.reload()
	}
	return t
}

func appendTimerKey(dst []byte, kg int, sid uint16, owner string, ts int64) []byte {
	dst = appendStatePrefix(dst, kg, sid)
	dst = binary.BigEndian.AppendUint64(dst, uint64(ts)^(1<<63))
	return append(dst, owner...)
}

// decodeTimerKey is the timer of a timer key's rest (after its key group
// and state id): appendTimerKey's inverse. rest holds 8 bytes or more.
func decodeTimerKey(rest []byte) pebbleTimerID {
	return pebbleTimerID{ts: int64(binary.BigEndian.Uint64(rest) ^ (1 << 63)), owner: string(rest[8:])}
}

// register writes the timer. Beyond its key group's cached head it does
// not read whether pebble holds it: setting a key pebble holds changes
// nothing, and the read (for a new timer, which a window's pane registers)
// was a sixth to a third of Nexmark q5's CPU with its state beyond the
// caches (docs/internals/benchmarks.md). Flink's RocksDB timers write
// without reading too. It reports false when the timer is known to exist
// (cached, or in known), true when it is new or may be.
func (t *pebbleTimers) register(kg int, owner string, ts int64) bool {
	id := pebbleTimerID{ts: ts, owner: owner}
	c := &t.caches[kg]
	if _, ok := c.find(id); ok {
		return false
	}
	if _, ok := t.known[id]; ok {
		return false
	}
	t.kbuf = appendTimerKey(t.kbuf[:0], kg, t.sid, owner, ts)
	if err := t.st.db.Set(t.kbuf, nil, pebble.NoSync); err != nil {
		t.st.fail(t.name, err)
	}
	if !c.covers(id) {
		t.know(id)
		return true
	}
	i, _ := c.find(id)
	c.ids = slices.Insert(c.ids, i, id)
	if len(c.ids) > timerCacheSize {
		t.know(c.ids[timerCacheSize])
		c.ids, c.complete = c.ids[:timerCacheSize], false
	}
	if i == 0 {
		t.min = -2
	}
	return true
}

// remove deletes the timer, without reading whether pebble holds it
// (register). It reports false when the timer is known not to exist (its
// key group's cached head covers it), true when it existed or may have.
func (t *pebbleTimers) remove(kg int, owner string, ts int64) bool {
	id := pebbleTimerID{ts: ts, owner: owner}
	c := &t.caches[kg]
	i, cached := c.find(id)
	if !cached && c.covers(id) {
		return false
	}
	delete(t.known, id)
	t.kbuf = appendTimerKey(t.kbuf[:0], kg, t.sid, owner, ts)
	if err := t.st.db.Delete(t.kbuf, pebble.NoSync); err != nil {
		t.st.fail(t.name, err)
	}
	if cached {
		c.ids = slices.Delete(c.ids, i, i+1)
		t.refill(kg)
		if i == 0 {
			t.min = -2
		}
	}
	return true
}

// refill loads key group kg's earliest timers after the key in kbuf (every
// earlier one is gone) if its cache ran empty while pebble holds more.
func (t *pebbleTimers) refill(kg int) {
	c := &t.caches[kg]
	if len(c.ids) > 0 || c.complete {
		return
	}
	t.hi = appendStatePrefix(t.hi[:0], kg, t.sid)
	t.hi = prefixEnd(t.hi)
	t.lo = append(t.lo[:0], t.kbuf...)
	it, err := t.st.db.NewIter(&pebble.IterOptions{LowerBound: t.lo, UpperBound: t.hi})
	if err != nil {
		t.st.fail(t.name, err)
	}
	for ok := it.First(); ok && len(c.ids) < timerCacheSize; ok = it.Next() {
		c.ids = append(c.ids, decodeTimerKey(it.Key()[4:]))
	}
	c.complete = !it.Valid()
	if err := it.Close(); err != nil {
		t.st.fail(t.name, err)
	}
}

func (t *pebbleTimers) peek() (pebbleTimerID, bool) {
	if t.min == -2 {
		t.min = -1
		for kg := range t.caches {
			c := &t.caches[kg]
			if len(c.ids) > 0 && (t.min < 0 || c.ids[0].less(t.caches[t.min].ids[0])) {
				t.min = kg
			}
		}
	}
	if t.min < 0 {
		return pebbleTimerID{}, false
	}
	return t.caches[t.min].ids[0], true
}

func (t *pebbleTimers) next(upTo int64) (pebbleTimerID, int, bool) {
	id, ok := t.peek()
	if !ok || id.ts > upTo {
		return pebbleTimerID{}, 0, false
	}
	kg := t.min
	t.kbuf = appendTimerKey(t.kbuf[:0], kg, t.sid, id.owner, id.ts)
	if err := t.st.db.Delete(t.kbuf, pebble.NoSync); err != nil {
		t.st.fail(t.name, err)
	}
	delete(t.known, id)
	c := &t.caches[kg]
	c.ids = slices.Delete(c.ids, 0, 1)
	t.refill(kg)
	t.min = -2
	return id, kg, true
}

// len counts the timers in pebble: a scan of them all, as Flink's RocksDB
// timers count theirs (register does not know whether a timer is new).
func (t *pebbleTimers) len() int {
	n := 0
	err := eachKeyGroup(t.st.db, t.st.maxPar, t.sid, func(int, []byte, []byte) error {
		n++
		return nil
	}, func(int) error { return nil })
	if err != nil {
		t.st.fail(t.name, err)
	}
	return n
}

// latest is the latest timer's timestamp: the last cached of a key group
// whose timers are all cached, else one seek to the end of its range.
func (t *pebbleTimers) latest() (int64, bool) {
	ts, ok := int64(0), false
	for kg := range t.caches {
		c := &t.caches[kg]
		var last int64
		if c.complete {
			if len(c.ids) == 0 {
				continue
			}
			last = c.ids[len(c.ids)-1].ts
		} else {
			t.lo = appendStatePrefix(t.lo[:0], kg, t.sid)
			t.hi = prefixEnd(append(t.hi[:0], t.lo...))
			it, err := t.st.db.NewIter(&pebble.IterOptions{LowerBound: t.lo, UpperBound: t.hi})
			if err != nil {
				t.st.fail(t.name, err)
				return 0, false
			}
			found := it.Last()
			if found {
				last = decodeTimerKey(it.Key()[4:]).ts
			}
			if err := it.Close(); err != nil {
				t.st.fail(t.name, err)
			}
			if !found {
				continue
			}
		}
		if !ok || last > ts {
			ts, ok = last, true
		}
	}
	return ts, ok
}

func (t *pebbleTimers) close() error { return nil }

func (t *pebbleTimers) snapshot() func() (map[int][]pebbleTimerID, error) {
	snap := t.st.snapshot()
	return func() (map[int][]pebbleTimerID, error) {
		if !t.st.begin(snap) {
			return nil, errStateClosed
		}
		defer t.st.done(snap)
		return encodeTimerIDs(snap, t.st.maxPar, t.sid)
	}
}

// encodeTimerIDs reads timer state sid of r, by key group, in order.
func encodeTimerIDs(r pebbleReader, maxPar int, sid uint16) (map[int][]pebbleTimerID, error) {
	out := map[int][]pebbleTimerID{}
	err := eachKeyGroup(r, maxPar, sid, func(kg int, rest, _ []byte) error {
		if len(rest) < 8 {
			return fmt.Errorf("%w: timer key of %d bytes", ErrDecode, len(rest))
		}
		out[kg] = append(out[kg], decodeTimerKey(rest))
		return nil
	}, func(int) error { return nil })
	for _, ids := range out {
		// pebble's order is (timestamp, owner bytes): pebbleTimerID.less.
		if !sort.SliceIsSorted(ids, func(i, j int) bool { return ids[i].less(ids[j]) }) {
			sort.Slice(ids, func(i, j int) bool { return ids[i].less(ids[j]) })
		}
	}
	return out, err
}

func (t *pebbleTimers) restored(kg int, owner string, ts int64) error {
	t.register(kg, owner, ts)
	return nil
}
