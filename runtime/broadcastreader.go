package runtime

// Reading broadcast state out of a snapshot, as Flink's State Processor API
// does (SavepointReader.readBroadcastState): per operator, per state
// (descriptor) name, its entries, decoded through the codecs the
// operator's Open declares. Every subtask checkpoints the same copy, so one
// copy is read.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
)

// ErrNoBroadcastState is wrapped by ReadBroadcastState's error when the
// operator keeps no broadcast state (it is not a ProcessBroadcast or
// ProcessKeyedBroadcast operator).
var ErrNoBroadcastState = errors.New("operator keeps no broadcast state")

// BroadcastRecord is one entry of an operator's broadcast state read from a
// snapshot. It marshals to the JSON line streamctl state dump prints for
// it.
type BroadcastRecord struct {
	// State is the broadcast state's name as declared (NewBroadcastState).
	State string `json:"broadcast_state"`
	// Key and Value are the decoded entry (nil when undecoded).
	Key   any `json:"key,omitempty"`
	Value any `json:"value,omitempty"`
	// Undecoded says why the key or the value is given as bytes
	// (KeyBase64, ValueBase64) instead: no job graph to take codecs from,
	// a state the operator no longer declares, or bytes its codec refused.
	Undecoded   string `json:"undecoded,omitempty"`
	KeyBase64   []byte `json:"key_base64,omitempty"`
	ValueBase64 []byte `json:"value_base64,omitempty"`
}

// HasBroadcastState reports whether the operator uid of j keeps broadcast
// state (ProcessBroadcast, ProcessKeyedBroadcast).
func (j *Job) HasBroadcastState(uid string) bool {
	for _, n := range j.nodes {
		if n.uid == uid {
			return n.broadcastState
		}
	}
	return false
}

// SplitBroadcastState splits one subtask's copy of broadcast state (its
// operator state entries) into its states, in name order, without
// decoding keys or values: what savepoint inspection reports per name.
// Entries counts the state's map entries.
func SplitBroadcastState(entries [][]byte) ([]StateBlob, error) {
	out := make([]StateBlob, 0, len(entries))
	for _, e := range entries {
		name, b, err := splitBroadcastEntry(e)
		if err != nil {
			return nil, err
		}
		n := 0
		if err := readEntries(b, func(_, _ []byte) error { n++; return nil }); err != nil {
			return nil, fmt.Errorf("broadcast state %q: %w", name, err)
		}
		out = append(out, StateBlob{Name: name, Bytes: len(b), Entries: n})
	}
	sort.Slice(out, func(i, k int) bool { return out[i].Name < out[k].Name })
	return out, nil
}

// ReadBroadcastState decodes one copy of the broadcast state of the
// operator uid of job j (the operator state entries of one subtask of a
// snapshot: every subtask holds the same) and calls emit for every entry,
// state by state in name order, entries in the order of their encoded
// keys. The operator's function is opened (its Open declares its
// broadcast states and their codecs) but runs nothing.
//
// With j nil, for a state the operator no longer declares, or for an entry
// its codecs refuse, keys and values are given as bytes
// (BroadcastRecord.Undecoded says why), never an error. Only entries whose
// framing is broken are an error, and an operator of j that keeps no
// broadcast state (ErrNoBroadcastState).
func ReadBroadcastState(ctx context.Context, j *Job, uid string, entries [][]byte, emit func(BroadcastRecord) error) error {
	why := "no codec: no job graph (give --job TYPE)"
	var reg *BroadcastRegistry
	if j != nil {
		n, err := j.operator(uid)
		if err != nil {
			return err
		}
		if n.broadcastReader == nil {
			return fmt.Errorf("%w: %q", ErrNoBroadcastState, uid)
		}
		if reg, err = n.broadcastReader(ctx); err != nil {
			return fmt.Errorf("open operator %q to read its broadcast state: %w", uid, err)
		}
		why = "no codec: the state is not declared by the operator"
	}
	type state struct {
		name string
		b    []byte
	}
	states := make([]state, 0, len(entries))
	for _, e := range entries {
		name, b, err := splitBroadcastEntry(e)
		if err != nil {
			return err
		}
		states = append(states, state{name, b})
	}
	sort.Slice(states, func(i, k int) bool { return states[i].name < states[k].name })
	for _, st := range states {
		var decl broadcastStore
		if reg != nil {
			for _, s := range reg.states {
				if s.name() == st.name {
					decl = s
				}
			}
		}
		var kvs [][2][]byte
		if err := readEntries(st.b, func(kb, vb []byte) error { kvs = append(kvs, [2][]byte{kb, vb}); return nil }); err != nil {
			return fmt.Errorf("broadcast state %q: %w", st.name, err)
		}
		sort.Slice(kvs, func(i, k int) bool { return bytes.Compare(kvs[i][0], kvs[k][0]) < 0 })
		for _, kv := range kvs {
			rec := BroadcastRecord{State: st.name}
			if decl == nil {
				rec.Undecoded, rec.KeyBase64, rec.ValueBase64 = why, kv[0], kv[1]
			} else if k, v, err := decl.decodeEntry(kv[0], kv[1]); err != nil {
				rec.Key, rec.Undecoded, rec.ValueBase64 = k, err.Error(), kv[1]
				if k == nil {
					rec.KeyBase64 = kv[0]
				}
			} else {
				rec.Key, rec.Value = k, v
			}
			if err := emit(rec); err != nil {
				return err
			}
		}
	}
	return nil
}
