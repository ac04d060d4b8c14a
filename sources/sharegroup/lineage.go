package sharegroup

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// The transactional source's operator state is one entry per subtask, its
// lineage position: the ack-log offset below which every committed
// checkpoint acknowledgement of the group is reflected in the snapshot's
// state, or predates the lineage (docs/internals/savepoints.md, "Share
// groups cannot rewind"). A subtask starts it at the ack-log's end when it
// opens (once the restore was verified, everything committed until then is
// the restored state's past) and moves it past every marker it writes, so
// that an epoch without acknowledgements carries it forward. Over all
// subtasks of a checkpoint the highest position is past every marker of the
// checkpoints it covers: a committed checkpoint marker of the group above
// it acknowledged records the state does not reflect.
//
// Encoding, version 1: "WSL" version(1 byte), position varint, the
// transactional-id prefix of the job that took it (uvarint length + bytes),
// consumed exactly. Checkpoints of an older Weir hold no entry: their
// position is taken from the restored marker transactions' handles.
const (
	lineageMagic   = "WSL"
	lineageVersion = 1
)

// lineage is one subtask's lineage position.
type lineage struct {
	// Below is the ack-log offset below which every committed checkpoint
	// acknowledgement of the group is reflected in the state.
	Below int64
	// Prefix is the transactional-id prefix of the job that took the
	// snapshot (of its marker transactions): whose lineage it is.
	Prefix string
}

func (l lineage) encode() []byte {
	b := append([]byte(lineageMagic), lineageVersion)
	b = binary.AppendVarint(b, l.Below)
	b = binary.AppendUvarint(b, uint64(len(l.Prefix)))
	return append(b, l.Prefix...)
}

// errBadLineage is wrapped by decodeLineage's errors.
var errBadLineage = errors.New("unreadable share-group source state")

func decodeLineage(b []byte) (lineage, error) {
	if len(b) < len(lineageMagic)+1 || string(b[:len(lineageMagic)]) != lineageMagic {
		return lineage{}, fmt.Errorf("%w: not a lineage position (no %q prefix)", errBadLineage, lineageMagic)
	}
	if v := b[len(lineageMagic)]; v != lineageVersion {
		return lineage{}, fmt.Errorf("%w: version %d (this Weir reads %d): written by a later Weir", errBadLineage, v, lineageVersion)
	}
	b = b[len(lineageMagic)+1:]
	var l lineage
	var n int
	if l.Below, n = binary.Varint(b); n <= 0 {
		return lineage{}, fmt.Errorf("%w: truncated position", errBadLineage)
	}
	b = b[n:]
	size, n := binary.Uvarint(b)
	if n <= 0 || size != uint64(len(b)-n) {
		return lineage{}, fmt.Errorf("%w: truncated or trailing bytes after the position", errBadLineage)
	}
	l.Prefix = string(b[n:])
	return l, nil
}

// restoredBelow returns the lineage position of restored state: the
// highest of its entries' and of the ack-log offsets of the restored
// marker transactions (handles), -1 when there is neither (a checkpoint of
// an older Weir that wrote no marker); and the prefixes of the jobs that
// took the entries.
func restoredBelow(entries [][]byte, handles []checkpoint.TxnHandle, ackLog string) (int64, []string, error) {
	below := int64(-1)
	var prefixes []string
	for _, e := range entries {
		l, err := decodeLineage(e)
		if err != nil {
			return 0, nil, err
		}
		below = max(below, l.Below)
		if l.Prefix != "" && !slices.Contains(prefixes, l.Prefix) {
			prefixes = append(prefixes, l.Prefix)
		}
	}
	for _, h := range handles {
		for _, p := range h.Partitions {
			if p.Topic == ackLog {
				below = max(below, p.FirstOffset+1)
			}
		}
	}
	return below, prefixes, nil
}

// verifyTimeout bounds VerifyRestore's reading of the ack-log.
const verifyTimeout = 30 * time.Second

// VerifyRestore implements runtime.RestoreVerifier: a transactional source
// refuses, unrecoverably (ErrRestoreBehindAcks), a restore of state behind
// its group's acknowledgements: a checkpoint marker of the group that
// committed in the ack-log above the restored lineage position (see
// lineage), whether still there or tombstoned since (a tombstone names its
// marker's offset and outcome). Those records are gone from the group and
// the restored state lacks their effect. Re-queue markers (no checkpoint)
// do not count: their records come back as copies. State without a
// position (a checkpoint of an older Weir in which the source wrote no
// marker) is not judged. The runtime asks at submit and before a job's
// first attempt restores; failovers are not judged, so that another job on
// the same group never fails a running job's restart.
func (s *Source[T]) VerifyRestore(ctx context.Context, r runtime.RestoredOperator) error {
	if s.cfg.mode != Transactional {
		return nil
	}
	below, prefixes, err := restoredBelow(r.Entries, r.Handles, s.cfg.ackLogTopic)
	if err != nil {
		return runtime.Unrecoverable(fmt.Errorf("checkpoint %d: %w", r.Checkpoint, err))
	}
	if below < 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, verifyTimeout)
	defer cancel()
	ix, err := acklog.NewIndex(ctx, s.cfg.brokers, s.cfg.ackLogTopic, s.cfg.clientOpts...)
	if err != nil {
		return fmt.Errorf("ack-log of share group %q: %w", s.cfg.group, err)
	}
	defer ix.Close()
	ix.KeepTombstoned()
	if err := ix.CatchUpToEnd(ctx); err != nil {
		return fmt.Errorf("ack-log of share group %q: %w", s.cfg.group, err)
	}
	var later []acklog.Entry
	for _, e := range ix.CommittedAfter(below - 1) {
		if e.Marker.Group == s.cfg.group && e.Marker.Checkpoint != 0 {
			later = append(later, e)
		}
	}
	if len(later) == 0 {
		return nil
	}
	e := later[0]
	more := ""
	if len(later) > 1 {
		more = fmt.Sprintf(", and %d more", len(later)-1)
	}
	taken := ""
	if len(prefixes) > 0 {
		taken = " (taken by " + strings.Join(prefixes, ", ") + ")"
	}
	return runtime.Unrecoverable(fmt.Errorf("%w: checkpoint %d%s restored for share group %q, but the ack-log holds a later committed "+
		"acknowledgement (offset %d, checkpoint %d of %s%s): those records are gone from the group and the restored state lacks their effect; "+
		"restore the latest savepoint or checkpoint of this job (the one its last stop --savepoint wrote) instead",
		ErrRestoreBehindAcks, r.Checkpoint, taken, s.cfg.group, e.Offset, e.Marker.Checkpoint, e.Marker.TransactionalID, more))
}

var _ runtime.RestoreVerifier = (*Source[int])(nil)
