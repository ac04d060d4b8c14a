package runtime

// TTL's cleanup on the pebble backend. Pebble's API has no compaction
// filter (RocksDB's, which Flink uses for TTL), so expired entries are
// swept in the task's goroutine, as the heap's incremental cleanup runs:
// every pebbleTTLSweepEvery accesses of a TTL state, one iterator checks
// the next CleanupPerAccess x pebbleTTLSweepEvery of its entries from a
// cursor that walks the subtask's key groups round and round, and deletes
// the expired ones in one batch. It works on bytes: every value, map entry
// and list element of a TTL state starts with its timestamp (ttlCodec), so
// nothing is decoded through the state's codecs. Reads never return an
// expired entry whether or not it was swept yet (state_ttl.go).

import (
	"bytes"
	"encoding/binary"

	"github.com/cockroachdb/pebble/v2"
)

// pebbleTTLSweepEvery is how many accesses of a TTL state pass between two
// sweeps: one iterator per sweep, its cost spread over the accesses.
const pebbleTTLSweepEvery = 1000

// pebbleStored is a pebble store of a state: its instance and state id.
type pebbleStored interface {
	pebbleRange() (*pebbleState, uint16, string)
}

func (s *pebbleValue[K, V]) pebbleRange() (*pebbleState, uint16, string) {
	return s.st, s.sid, s.stateName
}

func (m *pebbleMap[K, UK, UV]) pebbleRange() (*pebbleState, uint16, string) {
	return m.st, m.sid, m.stateName
}

func (l *pebbleList[K, T]) pebbleRange() (*pebbleState, uint16, string) { return l.m.pebbleRange() }

// pebbleTTLSweep sweeps one TTL state's expired entries out of pebble.
type pebbleTTLSweep struct {
	st   *pebbleState
	sid  uint16
	name string
	t    ttlClock
	n    int    // accesses since the last sweep
	kg   int    // the cursor's key group
	from []byte // the cursor: the next key to check in kg (nil: kg's first)
}

// setupPebbleTTL returns the cleanup of a TTL state stored in pebble (nil
// if store is not a pebble store, or cleanup is off).
func setupPebbleTTL(store any, t ttlClock) func() {
	ps, ok := store.(pebbleStored)
	if !ok || t.per == 0 {
		return nil
	}
	if c, ok := store.(interface{ noCache() }); ok {
		c.noCache()
	}
	st, sid, name := ps.pebbleRange()
	w := &pebbleTTLSweep{st: st, sid: sid, name: name, t: t, kg: -1}
	return w.access
}

// access counts one access of the state and sweeps every
// pebbleTTLSweepEvery.
func (w *pebbleTTLSweep) access() {
	if w.n++; w.n < pebbleTTLSweepEvery {
		return
	}
	w.n = 0
	w.sweep(w.t.per * pebbleTTLSweepEvery)
}

// sweep checks up to limit entries from the cursor on, at most once
// around the subtask's key groups, and deletes those expired.
func (w *pebbleTTLSweep) sweep(limit int) {
	st := w.st
	lo, hi := st.kgLo, st.kgHi
	if hi <= lo {
		lo, hi = 0, st.maxPar
	}
	if w.kg < lo || w.kg >= hi {
		w.kg, w.from = lo, nil
	}
	now := w.t.now()
	b := st.db.NewBatch()
	defer b.Close()
	checked := 0
	for groups := 0; checked < limit && groups <= hi-lo; {
		lower := appendStatePrefix(nil, w.kg, w.sid)
		upper := prefixEnd(lower)
		if w.from != nil {
			lower = w.from
		}
		it, err := st.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
		if err != nil {
			st.fail(w.name, err)
		}
		valid := it.First()
		for ; valid && checked < limit; valid = it.Next() {
			checked++
			v, err := it.ValueAndErr()
			if err != nil {
				_ = it.Close()
				st.fail(w.name, err)
			}
			if ts, n := binary.Varint(v); n > 0 && w.t.expired(ts, now) {
				if err := b.Delete(it.Key(), nil); err != nil {
					_ = it.Close()
					st.fail(w.name, err)
				}
			}
		}
		if valid {
			w.from = bytes.Clone(it.Key())
		} else {
			w.kg, w.from = w.kg+1, nil
			if w.kg >= hi {
				w.kg = lo
			}
			groups++
		}
		if err := it.Close(); err != nil {
			st.fail(w.name, err)
		}
	}
	if !b.Empty() {
		if err := b.Commit(pebble.NoSync); err != nil {
			st.fail(w.name, err)
		}
	}
}
