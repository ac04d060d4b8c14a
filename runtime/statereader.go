package runtime

// Reading keyed state out of a snapshot, as Flink's State Processor API
// does: the operator's keyed function is opened on an empty backend (so it
// declares its states, with their codecs, as it does when it runs), and the
// key-group blobs of a checkpoint or savepoint are decoded through those
// codecs, entry by entry. Nothing runs: no record is processed, no timer
// fires.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ErrUnknownOperator is wrapped by ReadKeyedState's error when the job has
// no operator with the UID; the error lists the UIDs it has.
var ErrUnknownOperator = errors.New("no operator with that uid")

// ErrNotKeyed is wrapped by ReadKeyedState's error when the operator keeps
// no keyed state (a source, a sink, a map).
var ErrNotKeyed = errors.New("operator keeps no keyed state")

// StateRecord is one entry of an operator's keyed state read from a
// snapshot: one key's value of one state, one entry of one key's map
// state, or one timer. It marshals to the JSON line streamctl state dump
// prints.
type StateRecord struct {
	// KeyGroup is the key group the entry is in.
	KeyGroup int `json:"key_group"`
	// State is the state's name as declared; timers are "timers" (the
	// operator's timer service) or "timers/<name>" (NewTimers).
	State string `json:"state"`
	// Key is the decoded key (nil when undecoded: see KeyBase64).
	Key any `json:"key,omitempty"`
	// Namespace is the window of a window operator's contents and the
	// namespace of a namespaced timer.
	Namespace any `json:"namespace,omitempty"`
	// MapKey is the user key of a map state entry (one record per entry).
	MapKey any `json:"map_key,omitempty"`
	// Value is the decoded value (nil for timers and when undecoded).
	Value any `json:"value,omitempty"`
	// Timer is set for a timer.
	Timer *TimerRecord `json:"timer,omitempty"`
	// Undecoded says why the key or the value is given as bytes
	// (KeyBase64, ValueBase64) instead: no job graph to take codecs from,
	// a state the operator no longer declares, or bytes its codec refused.
	Undecoded string `json:"undecoded,omitempty"`
	// KeyBase64 and ValueBase64 are the encoded key and value when they
	// are undecoded (base64 in JSON).
	KeyBase64   []byte `json:"key_base64,omitempty"`
	ValueBase64 []byte `json:"value_base64,omitempty"`
}

// TimerRecord is a timer in a StateRecord.
type TimerRecord struct {
	// Domain is "event-time" or "processing-time".
	Domain string `json:"domain"`
	// Timestamp is when it fires, epoch milliseconds.
	Timestamp int64 `json:"timestamp"`
}

// StateBlob is one state's part of a key-group blob.
type StateBlob struct {
	// Name is the state's name (timers as in StateRecord.State).
	Name string
	// Bytes is the number of bytes the state takes in the key group.
	Bytes int
	// Entries is the number of keys (timers for timers) it holds there.
	Entries int
}

// SplitKeyGroup splits the key-group blob of a keyed operator's snapshot
// into its states, in the order they are stored, without decoding keys or
// values: what savepoint inspection reports per state name.
func SplitKeyGroup(blob []byte) ([]StateBlob, error) {
	var out []StateBlob
	err := splitKeyGroup(blob, func(name string, data []byte) error {
		n, k := binary.Uvarint(data)
		if k <= 0 {
			return fmt.Errorf("state %q: %w: entry count", displayStateName(name), ErrDecode)
		}
		out = append(out, StateBlob{Name: displayStateName(name), Bytes: len(data), Entries: int(n)})
		return nil
	})
	return out, err
}

// splitKeyGroup calls fn for each state of a key-group blob (the format
// keyedBackend.snapshot writes).
func splitKeyGroup(blob []byte, fn func(name string, data []byte) error) error {
	for len(blob) > 0 {
		name, rest, err := readFrame(blob)
		if err != nil {
			return err
		}
		data, rest, err := readFrame(rest)
		if err != nil {
			return fmt.Errorf("state %q: %w", displayStateName(string(name)), err)
		}
		blob = rest
		if err := fn(string(name), data); err != nil {
			return err
		}
	}
	return nil
}

// timersPrefix starts the stored name of a timer service's state.
const timersPrefix = "\x00timers/"

// displayStateName is a stored state name as users see it.
func displayStateName(name string) string {
	svc, ok := strings.CutPrefix(name, timersPrefix)
	if !ok {
		_, declared := stateKind(name) // a list, reducing, aggregating or TTL state
		return declared
	}
	if svc == "" {
		return "timers"
	}
	return "timers/" + svc
}

// OperatorUIDs lists the UIDs of the job's operators, in graph order.
func (j *Job) OperatorUIDs() []string {
	uids := make([]string, 0, len(j.nodes))
	for _, n := range j.nodes {
		uids = append(uids, n.uid)
	}
	return uids
}

// operator is the node of the operator uid, for reading its state: the
// job's build error, or ErrUnknownOperator listing the UIDs it has.
func (j *Job) operator(uid string) (*node, error) {
	if j.err != nil {
		return nil, j.err
	}
	for _, n := range j.nodes {
		if n.uid == uid {
			return n, nil
		}
	}
	return nil, fmt.Errorf("%w %q: the job's operators are %s", ErrUnknownOperator, uid, strings.Join(j.OperatorUIDs(), ", "))
}

// ReadKeyedState decodes the keyed state of the operator uid of job j from
// the key-group blobs of a snapshot (every subtask's, by key group), and
// calls emit for every entry, key group by key group, in key group order.
// The operator's function is opened (its Open declares its states and
// their codecs) but runs nothing.
//
// With j nil, or for a state the operator no longer declares, keys and
// values are given as bytes (StateRecord.Undecoded says why), never an
// error: the rest of the state is still read. A key or value its codec
// refuses is given as bytes too. Only a blob whose framing is broken is an
// error.
func ReadKeyedState(ctx context.Context, j *Job, uid string, keyGroups map[int][]byte, emit func(StateRecord) error) error {
	var r keyedStateReader
	if j != nil {
		n, err := j.operator(uid)
		if err != nil {
			return err
		}
		if n.stateReader == nil {
			return fmt.Errorf("%w: %q", ErrNotKeyed, uid)
		}
		if r, err = n.stateReader(ctx); err != nil {
			return fmt.Errorf("open operator %q to read its state: %w", uid, err)
		}
	}
	kgs := make([]int, 0, len(keyGroups))
	for kg := range keyGroups {
		kgs = append(kgs, kg)
	}
	sort.Ints(kgs)
	for _, kg := range kgs {
		err := splitKeyGroup(keyGroups[kg], func(name string, data []byte) error {
			if r != nil {
				if ok, err := r.dump(kg, name, data, emit); ok || err != nil {
					return err
				}
			}
			return dumpRaw(kg, name, data, r, emit)
		})
		if err != nil {
			return fmt.Errorf("key group %d: %w", kg, err)
		}
	}
	return nil
}

// keyedStateReader decodes the states an opened keyed operator declared;
// dump reports false for a state it does not know.
type keyedStateReader interface {
	dump(kg int, name string, data []byte, emit func(StateRecord) error) (bool, error)
	// decodeKey decodes a key with the operator's key codec.
	decodeKey(b []byte) (any, error)
}

// stateDumper is implemented by every stateSnapshotter: it decodes one key
// group of the state.
type stateDumper interface {
	dump(kg int, data []byte, emit func(StateRecord) error) error
}

// newStateReader opens a keyed operator's function on an empty backend so
// that it declares its states.
func newStateReader[K comparable, T, U any](ctx context.Context, kc Codec[K], maxPar int, fn keyedFunction[K, T, U]) (keyedStateReader, error) {
	b := newKeyedBackend[K](kc, maxPar)
	st := &StateRegistry[K]{b: b}
	if fn.proc != nil {
		if _, err := NewTimers[struct{}](st, "", Codec[struct{}](voidCodec{})); err != nil {
			return nil, err
		}
	}
	if err := fn.open(ctx, st); err != nil {
		return nil, err
	}
	return backendReader[K]{b}, nil
}

type backendReader[K comparable] struct{ b *keyedBackend[K] }

func (r backendReader[K]) dump(kg int, name string, data []byte, emit func(StateRecord) error) (bool, error) {
	for _, s := range r.b.states {
		if s.name() == name {
			return true, s.(stateDumper).dump(kg, data, emit)
		}
	}
	return false, nil
}

func (r backendReader[K]) decodeKey(b []byte) (any, error) { return r.b.keyCodec.Decode(b) }

// dumpRaw emits a state without its codecs: keys decoded with the
// operator's key codec if r has one, values as bytes.
func dumpRaw(kg int, name string, data []byte, r keyedStateReader, emit func(StateRecord) error) error {
	why := "no codec: the state is not declared by the operator"
	if r == nil {
		why = "no codec: no job graph (give --job TYPE)"
	}
	rec := func(kb []byte) StateRecord {
		out := StateRecord{KeyGroup: kg, State: displayStateName(name), Undecoded: why, KeyBase64: kb}
		if r != nil {
			if k, err := r.decodeKey(kb); err == nil {
				out.Key, out.KeyBase64 = k, nil
			}
		}
		return out
	}
	if strings.HasPrefix(name, timersPrefix) {
		var errEmit error
		err := decodeTimers(data, func(d TimeDomain, owner string, ts int64) {
			if errEmit != nil {
				return
			}
			kb, rest, err := readFrame([]byte(owner))
			if err != nil {
				errEmit = err
				return
			}
			nb, _, err := readFrame(rest)
			if err != nil {
				errEmit = err
				return
			}
			out := rec(kb)
			out.ValueBase64 = nb // the namespace, undecoded
			out.Timer = &TimerRecord{Domain: d.String(), Timestamp: ts}
			errEmit = emit(out)
		})
		return errors.Join(err, errEmit)
	}
	return readEntries(data, func(kb, vb []byte) error {
		out := rec(kb)
		out.ValueBase64 = vb
		return emit(out)
	})
}

// readEntries calls fn for each key and value of one state's key group
// (the format keyedStore.freeze writes).
func readEntries(b []byte, fn func(kb, vb []byte) error) error {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return fmt.Errorf("%w: entry count", ErrDecode)
	}
	b = b[k:]
	for i := uint64(0); i < n; i++ {
		kb, rest, err := readFrame(b)
		if err != nil {
			return err
		}
		vb, rest, err := readFrame(rest)
		if err != nil {
			return err
		}
		b = rest
		if err := fn(kb, vb); err != nil {
			return err
		}
	}
	return nil
}

func (s *keyedStore[K, V]) dump(kg int, data []byte, emit func(StateRecord) error) error {
	return readEntries(data, func(kb, vb []byte) error {
		rec := StateRecord{KeyGroup: kg, State: displayStateName(s.stateName)}
		key, err := s.keyCodec.Decode(kb)
		if err != nil {
			rec.Undecoded, rec.KeyBase64, rec.ValueBase64 = fmt.Sprintf("key codec: %v", err), kb, vb
			return emit(rec)
		}
		rec.Key = key
		val, err := s.valCodec.Decode(vb)
		if err != nil {
			rec.Undecoded, rec.ValueBase64 = fmt.Sprintf("value codec: %v", err), vb
			return emit(rec)
		}
		if s.entries == nil {
			rec.Value = val
			return emit(rec)
		}
		return s.entries(val, func(mk, mv any) error {
			e := rec
			if s.stateName == windowState {
				e.Namespace = mk
			} else {
				e.MapKey = mk
			}
			e.Value = mv
			return emit(e)
		})
	})
}

func (t *Timers[K, N]) dump(kg int, data []byte, emit func(StateRecord) error) error {
	var errEmit error
	err := decodeTimers(data, func(d TimeDomain, owner string, ts int64) {
		if errEmit != nil {
			return
		}
		rec := StateRecord{KeyGroup: kg, State: displayStateName(t.name()), Timer: &TimerRecord{Domain: d.String(), Timestamp: ts}}
		kb, rest, err := readFrame([]byte(owner))
		if err != nil {
			errEmit = err
			return
		}
		nb, _, err := readFrame(rest)
		if err != nil {
			errEmit = err
			return
		}
		key, kerr := t.keyCodec.Decode(kb)
		ns, nerr := t.nsCodec.Decode(nb)
		switch {
		case kerr != nil:
			rec.Undecoded, rec.KeyBase64, rec.ValueBase64 = fmt.Sprintf("key codec: %v", kerr), kb, nb
		case nerr != nil:
			rec.Key, rec.Undecoded, rec.ValueBase64 = key, fmt.Sprintf("namespace codec: %v", nerr), nb
		default:
			rec.Key = key
			if _, void := any(ns).(struct{}); !void {
				rec.Namespace = ns
			}
		}
		errEmit = emit(rec)
	})
	return errors.Join(err, errEmit)
}
