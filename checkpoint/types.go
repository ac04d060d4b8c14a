// Package checkpoint owns the checkpoint protocol of a Weir job: the coordinator
// (a pure state machine that decides when checkpoints are triggered, completed,
// aborted and notified), the pebble-backed store of completed checkpoints (the
// commit point of the job's distributed transaction), and the contracts that
// operators implement to take part (snapshots, transaction handles, listeners).
//
// It deals in ids, task names, handles and opaque bytes only. It must not know
// about runtime operators, Kafka, RPC or the cluster: the runtime, the job
// manager and the connectors adapt to it, never the other way round.
package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync/atomic"
	"time"
)

// ID identifies a checkpoint of one job. IDs strictly increase over the life of
// the job, across restarts and failovers; 0 means "no checkpoint".
type ID uint64

// Latest holds the highest checkpoint id noted so far, safe for concurrent
// use: the latest completed checkpoint, say, noted by notifications and
// cancels that may arrive out of order. The zero value holds 0 (none).
type Latest struct{ v atomic.Uint64 }

// Note raises the held id to id if id is higher.
func (l *Latest) Note(id ID) {
	for {
		cur := l.v.Load()
		if uint64(id) <= cur || l.v.CompareAndSwap(cur, uint64(id)) {
			return
		}
	}
}

// Load returns the held id.
func (l *Latest) Load() ID { return ID(l.v.Load()) }

// TaskID names one parallel subtask of a job, e.g. "map-3#1". It is stable
// for a given job graph and parallelism.
type TaskID string

// TxnHandle is everything needed to finish a pre-committed Kafka transaction
// from any process: commit it on recovery, or abort it. Match transactions by
// producer id, never by epoch alone: the epoch bumps after every EndTxn.
type TxnHandle struct {
	TransactionalID string `json:"transactional_id"`
	ProducerID      int64  `json:"producer_id"`
	Epoch           int16  `json:"epoch"`
	// Checkpoint is the checkpoint whose epoch this transaction carries.
	Checkpoint ID `json:"checkpoint"`
	// Partitions are the partitions the transaction wrote to, each with
	// the offset of its first record there: what recovery needs to find
	// the transaction's records when the broker lost its state. Empty in
	// handles recorded before this field existed.
	Partitions []TxnPartition `json:"partitions,omitempty"`
}

// TxnPartition is one partition a transaction wrote to.
type TxnPartition struct {
	Topic       string `json:"topic"`
	Partition   int32  `json:"partition"`
	FirstOffset int64  `json:"first_offset"`
}

// OperatorSnapshot is the state one operator of one subtask took at a barrier.
// Operators are matched on restore by UID, so it survives graph changes that
// keep UIDs stable.
type OperatorSnapshot struct {
	UID string `json:"uid"`
	// Subtask and Parallelism record where the snapshot was taken.
	Subtask     int `json:"subtask"`
	Parallelism int `json:"parallelism"`
	// MaxParallelism is the number of key groups KeyGroups is split into
	// (0: the operator keeps no keyed state, or the checkpoint predates the
	// field). Keyed state can only be restored with the same number.
	MaxParallelism int `json:"max_parallelism,omitempty"`
	// State is operator (non-keyed) state as a list of entries; on restore at
	// another parallelism the entries of all subtasks are redistributed.
	State [][]byte `json:"state,omitempty"`
	// KeyGroups holds keyed state, one opaque blob per key group, so key groups
	// can move between subtasks when the parallelism changes.
	KeyGroups map[int][]byte `json:"key_groups,omitempty"`
	// StateRefs, when the task wrote its state to checkpoint storage, hold
	// the operator state entries instead of State: one reference per entry,
	// in order. An operator's entries are all in State or all in StateRefs.
	StateRefs []StateRef `json:"state_refs,omitempty"`
	// KeyGroupRefs are key groups written to checkpoint storage, by key
	// group. A key group is in KeyGroups or in KeyGroupRefs, never both.
	KeyGroupRefs map[int]StateRef `json:"key_group_refs,omitempty"`
	// Native, instead of KeyGroups and KeyGroupRefs, is the keyed state
	// of the subtask as a native (backend-specific) snapshot: the files of
	// its pebble instance in checkpoint storage. Only checkpoints are
	// native; a savepoint holds canonical key groups.
	Native *NativeState `json:"native,omitempty"`
	// Handles are the transactions this operator pre-committed for the
	// checkpoint. They are committed when the checkpoint completes and again,
	// idempotently, on restore from it.
	Handles []TxnHandle `json:"handles,omitempty"`
	// Watermark is the last watermark a source subtask emitted before the
	// barrier (nil: none, or not a source). A restore starts the source's
	// watermark there, so that a record late before a failure is late
	// after it too (docs/internals/event-time.md, "Watermarks across a
	// restore"). Never MaxWatermark: a source that ended or drained keeps
	// nothing.
	Watermark *int64 `json:"watermark,omitempty"`
	// Encode, if set, is keyed state not encoded yet (the heap backend's
	// frozen state): it encodes the key groups one at a time in increasing
	// order and calls yield with each, whose bytes are valid only until
	// yield returns, and returns yield's first error. SegmentWriter.Write
	// uploads each key group as it is encoded, so that the task never
	// holds its whole encoded state; EncodeKeyGroups puts them in
	// KeyGroups where the snapshot stays inline. Its key groups are not in
	// KeyGroups. It runs once. The task side only: never sent or stored.
	Encode func(yield func(kg int, b []byte) error) error `json:"-"`
}

// EncodeKeyGroups runs s.Encode, if set, adding a copy of each key group it
// encodes to s.KeyGroups, and clears it.
func (s *OperatorSnapshot) EncodeKeyGroups() error {
	if s.Encode == nil {
		return nil
	}
	enc := s.Encode
	s.Encode = nil
	err := enc(func(kg int, b []byte) error {
		if s.KeyGroups == nil {
			s.KeyGroups = map[int][]byte{}
		}
		s.KeyGroups[kg] = slices.Clone(b)
		return nil
	})
	if err != nil {
		return fmt.Errorf("encode the key groups of %s: %w", s.UID, err)
	}
	return nil
}

// EncodeKeyGroups runs EncodeKeyGroups on every operator of s, the first
// error ending it.
func (s TaskSnapshot) EncodeKeyGroups() error {
	for i := range s.Operators {
		if err := s.Operators[i].EncodeKeyGroups(); err != nil {
			return err
		}
	}
	return nil
}

// NativeState is the native snapshot of one keyed operator subtask's state
// backend (docs/internals/checkpoint-storage.md): the files of a pebble
// checkpoint of its instance, each an object of checkpoint storage, and the
// key groups [KeyGroupStart, KeyGroupEnd) the instance held, so that a
// restore at another parallelism takes the instances overlapping its own
// key groups. An immutable file (an SST) the task uploaded for an earlier
// checkpoint is referenced again, not uploaded again (its reference's
// Checkpoint is that earlier checkpoint).
type NativeState struct {
	// Backend names the state backend that wrote the files ("pebble").
	Backend       string `json:"backend"`
	KeyGroupStart int    `json:"key_group_start"`
	KeyGroupEnd   int    `json:"key_group_end"`
	// Meta is the backend's description of what the files hold (its
	// states), opaque here.
	Meta  []byte       `json:"meta,omitempty"`
	Files []NativeFile `json:"files,omitempty"`
	// Open reads a file of Files (each with its Name and, in
	// Ref.Length, its size) on the task until SegmentWriter.Write uploads
	// it; Release then drops the local copy. The task side only: never
	// sent or stored.
	Open    func(name string) (io.ReadCloser, error) `json:"-"`
	Release func()                                   `json:"-"`
}

// NativeFile is one file of a native snapshot: its name in the backend's
// directory and where its bytes are (the whole object Ref.Key).
type NativeFile struct {
	Name string   `json:"name"`
	Ref  StateRef `json:"ref"`
}

// Overlaps reports whether the state covers a key group of [lo, hi).
func (n *NativeState) Overlaps(lo, hi int) bool {
	return n != nil && n.KeyGroupStart < hi && lo < n.KeyGroupEnd
}

// StateRef locates state bytes a task wrote to checkpoint storage (package
// checkpoint/storage): Length bytes at Offset of the object Key, whose
// CRC-32C (Castagnoli) is CRC. Checkpoint is the checkpoint the object was
// written for; a reference with a Checkpoint below the checkpoint that
// holds it was reused from an earlier checkpoint (an incremental
// checkpoint), and is valid only while that object is still referenced by
// a retained checkpoint (SharedRegistry.Check).
type StateRef struct {
	Key        string `json:"key"`
	Offset     int64  `json:"offset"`
	Length     int64  `json:"length"`
	CRC        uint32 `json:"crc"`
	Checkpoint ID     `json:"checkpoint"`
}

// Refs returns every state reference of the operator.
func (s OperatorSnapshot) Refs() []StateRef {
	refs := slices.Clone(s.StateRefs)
	for _, r := range s.KeyGroupRefs {
		refs = append(refs, r)
	}
	if s.Native != nil {
		for _, f := range s.Native.Files {
			refs = append(refs, f.Ref)
		}
	}
	return refs
}

// TaskSnapshot is what a subtask acknowledges a checkpoint with.
type TaskSnapshot struct {
	Task      TaskID             `json:"task"`
	Operators []OperatorSnapshot `json:"operators"`
}

// Handles returns every transaction handle of the snapshot.
func (s TaskSnapshot) Handles() []TxnHandle {
	var hs []TxnHandle
	for _, op := range s.Operators {
		hs = append(hs, op.Handles...)
	}
	return hs
}

// Size is the number of state bytes in the snapshot: held inline and
// referenced in checkpoint storage (the full size of the state).
func (s TaskSnapshot) Size() int64 {
	var n int64
	for _, op := range s.Operators {
		for _, e := range op.State {
			n += int64(len(e))
		}
		for _, kg := range op.KeyGroups {
			n += int64(len(kg))
		}
		for _, r := range op.Refs() {
			n += r.Length
		}
	}
	return n
}

// Uploaded is the number of state bytes checkpoint id added: held inline,
// or written to checkpoint storage for id. References reused from earlier
// checkpoints (incremental checkpoints) do not count.
func (s TaskSnapshot) Uploaded(id ID) int64 {
	n := s.Size()
	for _, op := range s.Operators {
		for _, r := range op.Refs() {
			if r.Checkpoint != id {
				n -= r.Length
			}
		}
	}
	return n
}

// Refs returns every state reference of the snapshot.
func (s TaskSnapshot) Refs() []StateRef {
	var refs []StateRef
	for _, op := range s.Operators {
		refs = append(refs, op.Refs()...)
	}
	return refs
}

// TaskStats are the per-task timings reported with an acknowledgement.
type TaskStats struct {
	// AckLatency is from trigger to the coordinator receiving the ack.
	AckLatency time.Duration `json:"ack_latency"`
	// Alignment is how long the task held inputs back waiting for barriers.
	Alignment time.Duration `json:"alignment"`
	Size      int64         `json:"size"`
}

// Completed is a checkpoint every task acknowledged. Writing it to the Store is
// the commit point of the job's distributed transaction.
type Completed struct {
	Job         string                  `json:"job"`
	ID          ID                      `json:"id"`
	TriggeredAt time.Time               `json:"triggered_at"`
	CompletedAt time.Time               `json:"completed_at"`
	Tasks       map[TaskID]TaskSnapshot `json:"tasks"`
	Stats       map[TaskID]TaskStats    `json:"stats,omitempty"`
}

// Handles returns every transaction handle of the checkpoint.
func (c Completed) Handles() []TxnHandle {
	var hs []TxnHandle
	for _, t := range c.Tasks {
		hs = append(hs, t.Handles()...)
	}
	return hs
}

// Size is the number of state bytes in the checkpoint, inline and
// referenced (its full size).
func (c Completed) Size() int64 {
	var n int64
	for _, t := range c.Tasks {
		n += t.Size()
	}
	return n
}

// Uploaded is the number of state bytes the checkpoint added (its
// incremental size): Size less the references it reused from earlier
// checkpoints.
func (c Completed) Uploaded() int64 {
	var n int64
	for _, t := range c.Tasks {
		n += t.Uploaded(c.ID)
	}
	return n
}

// Refs returns every state reference of the checkpoint.
func (c Completed) Refs() []StateRef {
	var refs []StateRef
	for _, t := range c.Tasks {
		refs = append(refs, t.Refs()...)
	}
	return refs
}

// Listener is implemented by operators that take part in checkpoint
// completion, e.g. transactional sinks and acknowledging sources.
//
// Notifications are best effort (as in Flink): one may be lost when a process
// dies, so an implementation must also finish its pre-committed work on
// restore, and must treat notifications idempotently. A notification for n
// covers every checkpoint <= n.
type Listener interface {
	NotifyCheckpointComplete(ctx context.Context, id ID) error
	NotifyCheckpointAborted(ctx context.Context, id ID) error
}

// CancelListener is implemented by participants that hold transactions or
// broker-side state across checkpoints (a transactional source's ack
// markers and held records). NotifyJobCanceled is called once when the job
// is cancelled for good (never restored again), with its latest completed
// checkpoint (0: none): commit what that checkpoint covers, since its
// notification may have been lost, abort everything later, and release
// what is held, so that a cancelled job leaves nothing open behind.
type CancelListener interface {
	NotifyJobCanceled(ctx context.Context, lastCompleted ID) error
}

// AbortCarrier is implemented by a Listener whose work pre-committed for a
// checkpoint that is then aborted is not discarded: it stays pending, the
// next snapshot names it (so a restore from that checkpoint commits it), and
// the next completed checkpoint commits it, as the Kafka sink does with its
// transactions. NotifyCheckpointAborted then releases nothing.
//
// A job may tolerate failed checkpoints (carry on without rolling back) only
// if every Listener in it is an AbortCarrier: a Listener that discards an
// aborted checkpoint's work (aborts its transaction, as the protocol's step
// 7 allows) while the job carries on loses that epoch's records. Executors
// therefore tolerate no failed checkpoint in a job with any other Listener:
// every failed checkpoint rolls such a job back to its last completed one.
type AbortCarrier interface {
	Listener
	CarriesAbortedCheckpoints()
}

// ErrDeclined is wrapped by errors with which a task refuses a checkpoint.
var ErrDeclined = errors.New("checkpoint declined")

// ErrCorrupt is wrapped by store errors about checkpoints that fail their
// checksum or cannot be decoded.
var ErrCorrupt = errors.New("checkpoint corrupt")

// ErrNotFound is returned when no completed checkpoint exists.
var ErrNotFound = errors.New("no completed checkpoint")
