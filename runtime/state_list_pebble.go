package runtime

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// pebbleList is a list state in pebble: one pebble key per element, the
// framed key followed by a sequence number of the subtask's list (8 bytes,
// big endian), so that a key's elements are one range in the order they
// were added. Add appends without reading the list: the sequence number
// comes from a counter of the state, not from the stored list.
type pebbleList[K comparable, T any] struct {
	m    *pebbleMap[K, uint64, T]
	next uint64 // sequence number of the next element
}

// seqCodec encodes a list element's sequence number, big endian (byte
// order is number order).
type seqCodec struct{}

func (seqCodec) Append(dst []byte, n uint64) []byte { return binary.BigEndian.AppendUint64(dst, n) }
func (seqCodec) Decode(b []byte) (uint64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("%w: list element sequence of %d bytes", ErrDecode, len(b))
	}
	return binary.BigEndian.Uint64(b), nil
}

func newPebbleList[K comparable, T any](r *StateRegistry[K], stored string, c Codec[T]) *pebbleList[K, T] {
	p := r.b.pebble
	sid := p.stateID(stored, pebbleKindList)
	l := &pebbleList[K, T]{m: &pebbleMap[K, uint64, T]{st: p, stateName: stored, sid: sid, key: r.b.pkey, kc: seqCodec{}, vc: c,
		stateDumper: &keyedStore[K, []T]{stateName: stored, keyCodec: r.b.keyCodec, valCodec: listCodec[T]{c}, entries: listEntries[T]}}}
	l.next = p.restoredNext[sid]
	p.infos[sid].next = func() uint64 { return l.next }
	return l
}

func (l *pebbleList[K, T]) each(fn func(T) bool) {
	l.m.each(func(_ uint64, v T) bool { return fn(v) })
}

func (l *pebbleList[K, T]) add(vs ...T) {
	for _, v := range vs {
		l.m.put(l.next, v)
		l.next++
	}
}

func (l *pebbleList[K, T]) update(vs []T) {
	l.m.clear()
	l.add(vs...)
}

func (l *pebbleList[K, T]) clear() { l.m.clear() }

func (l *pebbleList[K, T]) name() string { return l.m.stateName }
func (l *pebbleList[K, T]) close() error { return nil }
func (l *pebbleList[K, T]) dump(kg int, data []byte, emit func(StateRecord) error) error {
	return l.m.stateDumper.dump(kg, data, emit)
}

// freeze writes the canonical blob of a list state (the heap's): per key,
// the framed key and the framed list (its elements' frames), built from
// the key's consecutive elements without decoding them.
func (l *pebbleList[K, T]) freeze() frozenState {
	return &frozenBlobs{enc: l.m.st.encodeLater(l.m.sid, encodeListBlobs)}
}

// encodeListBlobs encodes list state sid of r as canonical blobs.
func encodeListBlobs(r pebbleReader, maxPar int, sid uint16) (map[int][]byte, error) {
	out := map[int][]byte{}
	var body, cur, elems []byte // cur: the framed key of elems
	keys, n := 0, 0
	flush := func() {
		if n == 0 {
			return
		}
		body = append(body, cur...)
		body = appendFrame(body, elems)
		keys++
		elems, n = elems[:0], 0
	}
	err := eachKeyGroup(r, maxPar, sid, func(_ int, rest, val []byte) error {
		if len(rest) < 8 {
			return fmt.Errorf("%w: list element key", ErrDecode)
		}
		framed := rest[:len(rest)-8]
		if n > 0 && !bytes.Equal(framed, cur) {
			flush()
		}
		if n == 0 {
			cur = append(cur[:0], framed...)
		}
		elems = appendFrame(elems, val)
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

func (l *pebbleList[K, T]) restore(kg int, blob []byte) error {
	m := l.m
	b := m.st.newBatch()
	defer b.close()
	var key []byte
	err := readEntries(blob, func(kb, vb []byte) error {
		key = appendStatePrefix(key[:0], kg, m.sid)
		key = appendFrame(key, kb)
		plen := len(key)
		for len(vb) > 0 {
			elem, rest, err := readFrame(vb)
			if err != nil {
				return err
			}
			vb = rest
			key = binary.BigEndian.AppendUint64(key[:plen], l.next)
			l.next++
			if err := b.Set(key, elem); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("state %q key group %d: %w", m.stateName, kg, err)
	}
	if err := b.commit(); err != nil {
		return fmt.Errorf("state %q key group %d: %w", m.stateName, kg, err)
	}
	return nil
}
