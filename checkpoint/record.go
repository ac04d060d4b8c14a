package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Completed checkpoints outside the pebble store.
//
// A job manager that keeps its completed checkpoints' metadata in object
// storage (high availability: docs/internals/high-availability.md) writes
// each one as one object in the very record encoding the pebble store
// uses, so both stores decode, verify and fall back alike:
//
//	[magic "WCK1"][uvarint: length of the meta record][meta record][handles record]
//
// where both records are sealed as the store seals them (format byte,
// CRC32C over the store key, format and payload). Whatever the snapshot
// types gain rides along in the records.

// recordMagic starts an encoded completed checkpoint.
const recordMagic = "WCK1"

// EncodeCompleted encodes c as one verifiable blob (DecodeCompleted reads
// it back).
func EncodeCompleted(c Completed) ([]byte, error) {
	if err := checkJob(c.Job); err != nil {
		return nil, fmt.Errorf("encode checkpoint: %w", err)
	}
	if c.ID == 0 {
		return nil, fmt.Errorf("encode checkpoint of job %q: id 0 is not a checkpoint", c.Job)
	}
	meta, handles, err := encodeCompleted(c)
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint %d of job %q: %w", c.ID, c.Job, err)
	}
	m := sealRecord(cpKey(c.Job, c.ID, recMeta), meta)
	h := sealRecord(cpKey(c.Job, c.ID, recHandles), handles)
	b := make([]byte, 0, len(recordMagic)+binary.MaxVarintLen64+len(m)+len(h))
	b = append(b, recordMagic...)
	b = binary.AppendUvarint(b, uint64(len(m)))
	b = append(append(b, m...), h...)
	return b, nil
}

// splitRecord splits an encoded checkpoint into its two records; a part
// that cannot be found is nil (and then fails verification as missing).
func splitRecord(id ID, b []byte) rawCheckpoint {
	r := rawCheckpoint{id: id}
	if len(b) < len(recordMagic) || string(b[:len(recordMagic)]) != recordMagic {
		return r
	}
	b = b[len(recordMagic):]
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return r
	}
	r.meta, r.handles = b[k:k+int(n)], b[k+int(n):]
	return r
}

// DecodeCompleted decodes and verifies checkpoint id of job encoded by
// EncodeCompleted. A blob that fails verification (damaged, truncated, of
// another job or id) is an error wrapping ErrCorrupt (a *CorruptError).
func DecodeCompleted(job string, id ID, b []byte) (Completed, error) {
	return splitRecord(id, b).decode(job)
}

// DecodeSummary returns the summary of checkpoint id of job encoded by
// EncodeCompleted, without decoding its state.
func DecodeSummary(job string, id ID, b []byte) (Summary, error) {
	return splitRecord(id, b).summary(job)
}

// SkippedOf describes checkpoint id of job, encoded as b (nil: missing),
// which a restore passes over because of err: its transaction handles, if
// they still verify, are to be committed (see Store.LatestUsable).
func SkippedOf(job string, id ID, b []byte, err error) Skipped {
	if err == nil {
		err = &CorruptError{Job: job, ID: id, Record: "meta", Err: errors.New("record missing")}
	}
	return splitRecord(id, b).skipped(job, err)
}
