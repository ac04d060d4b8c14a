package checkpoint

// State in checkpoint storage (docs/internals/checkpoint-storage.md): a task
// writes the state of one checkpoint as at most one segment object,
//
//	<job>/shared/<task>/<checkpoint>-<random>.seg
//
// the concatenation of its operator state entries and of the key groups
// that changed since its base (the last checkpoint it was told completed),
// and acknowledges with references (StateRef: key, offset, length, CRC-32C)
// instead of the bytes. Key groups whose bytes did not change keep their
// previous reference (incremental checkpoints). The job manager tracks which
// retained checkpoints reference which object (SharedRegistry) and deletes
// the objects none references.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/cespare/xxhash/v2"

	"github.com/weirstream/weir/checkpoint/storage"
)

// DefaultInlineLimit is the task snapshot size below which a task's state
// stays inline in its acknowledgement rather than going to checkpoint
// storage (Flink's state.storage.fs.memory-threshold, 20 KiB).
const DefaultInlineLimit = 20 << 10

// ErrStateUnreadable is wrapped by the error of a restore whose state in
// checkpoint storage is missing or fails its checksum; the error names the
// object.
var ErrStateUnreadable = errors.New("checkpoint state unreadable")

// ErrStaleReference is wrapped by SharedRegistry.Check's error: the
// checkpoint reuses an object no retained checkpoint references any more
// (it may have been deleted), so it must not complete.
var ErrStaleReference = errors.New("checkpoint reuses a deleted state object")

// SharedPrefix is the key prefix under which the tasks of job write their
// segments; the orphan sweep walks it.
func SharedPrefix(job string) string { return keySegment(job) + "/shared/" }

// keySegment makes s one clean segment of an object key: characters other
// than letters, digits, '-', '_' and '.' become '_', and a leading '.' too.
func keySegment(s string) string {
	b := []byte(s)
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
		if !ok || (i == 0 && c == '.') {
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		return "_"
	}
	return string(b)
}

// segmentKey names a new segment of task for checkpoint id.
func segmentKey(job string, task TaskID, id ID) (string, error) {
	var r [8]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s%s/%d-%s.seg", SharedPrefix(job), keySegment(string(task)), id, hex.EncodeToString(r[:])), nil
}

// StateBase is what a task's incremental checkpoints compare against: for
// each key group of each operator, a hash of its bytes and where they are.
// The zero value (nil) is no base: every key group is written.
type StateBase map[baseKey]baseEntry

type baseKey struct {
	uid string
	kg  int
}

type baseEntry struct {
	hash uint64
	ref  StateRef
}

// SegmentWriter writes tasks' snapshots to checkpoint storage.
type SegmentWriter struct {
	st     storage.Storage
	job    string
	inline int64
}

// NewSegmentWriter writes the state of job's tasks to st; snapshots smaller
// than inline bytes stay inline (0: DefaultInlineLimit, negative: none).
func NewSegmentWriter(st storage.Storage, job string, inline int64) *SegmentWriter {
	if inline == 0 {
		inline = DefaultInlineLimit
	}
	return &SegmentWriter{st: st, job: job, inline: inline}
}

// Write writes snap, taken for checkpoint id, to storage unless it is small
// enough to stay inline, and returns the snapshot to acknowledge with (its
// state replaced by references), the base the next checkpoint compares
// against once id is confirmed complete, and the bytes written. A key
// group whose bytes hash as in base keeps base's reference and is not
// written again. At most one object is written.
func (w *SegmentWriter) Write(ctx context.Context, id ID, snap TaskSnapshot, base StateBase) (out TaskSnapshot, next StateBase, written int64, err error) {
	if snap.Size() < w.inline {
		return snap, nil, 0, nil
	}
	key, err := segmentKey(w.job, snap.Task, id)
	if err != nil {
		return TaskSnapshot{}, nil, 0, fmt.Errorf("checkpoint %d of task %s: %w", id, snap.Task, err)
	}
	var buf bytes.Buffer
	fresh := 0
	add := func(b []byte) StateRef {
		fresh++
		r := StateRef{Key: key, Offset: int64(buf.Len()), Length: int64(len(b)), CRC: crc32.Checksum(b, castagnoli), Checkpoint: id}
		buf.Write(b)
		return r
	}
	next = StateBase{}
	out = TaskSnapshot{Task: snap.Task, Operators: make([]OperatorSnapshot, len(snap.Operators))}
	for i, op := range snap.Operators {
		o := op
		o.State, o.KeyGroups = nil, nil
		o.StateRefs = slices.Clone(op.StateRefs)
		o.KeyGroupRefs = maps.Clone(op.KeyGroupRefs)
		for _, e := range op.State {
			o.StateRefs = append(o.StateRefs, add(e))
		}
		if len(op.KeyGroups) > 0 && o.KeyGroupRefs == nil {
			o.KeyGroupRefs = make(map[int]StateRef, len(op.KeyGroups))
		}
		for _, kg := range slices.Sorted(maps.Keys(op.KeyGroups)) {
			b := op.KeyGroups[kg]
			k := baseKey{op.UID, kg}
			h := xxhash.Sum64(b)
			if e, ok := base[k]; ok && e.hash == h && e.ref.Length == int64(len(b)) {
				o.KeyGroupRefs[kg] = e.ref
				next[k] = e
				continue
			}
			r := add(b)
			o.KeyGroupRefs[kg] = r
			next[k] = baseEntry{hash: h, ref: r}
		}
		out.Operators[i] = o
	}
	if fresh == 0 {
		return out, next, 0, nil // every key group reused
	}
	n := int64(buf.Len())
	if err := w.st.Put(ctx, key, &buf); err != nil {
		return TaskSnapshot{}, nil, 0, fmt.Errorf("checkpoint %d of task %s: write state: %w", id, snap.Task, err)
	}
	return out, next, n, nil
}

// Resolve reads every referenced state of c from st back into the
// snapshots, so c holds its state inline (a self-contained checkpoint, as
// a savepoint must be). A missing or corrupt object is an error wrapping
// ErrStateUnreadable that names it. st may be nil when c references
// nothing; a c with references then fails, saying so.
func Resolve(ctx context.Context, st storage.Storage, c Completed) (Completed, error) {
	refs := c.Refs()
	if len(refs) == 0 {
		return c, nil
	}
	if st == nil {
		return Completed{}, fmt.Errorf("checkpoint %d of job %q references state in checkpoint storage, and none is configured (--checkpoint-storage)", c.ID, c.Job)
	}
	got, err := ReadRefs(ctx, st, refs)
	if err != nil {
		return Completed{}, fmt.Errorf("checkpoint %d of job %q: %w", c.ID, c.Job, err)
	}
	out := c
	out.Tasks = make(map[TaskID]TaskSnapshot, len(c.Tasks))
	for id, t := range c.Tasks {
		nt := TaskSnapshot{Task: t.Task, Operators: make([]OperatorSnapshot, len(t.Operators))}
		for i, op := range t.Operators {
			o := op
			o.State = slices.Clone(op.State)
			for _, r := range op.StateRefs {
				o.State = append(o.State, got[r])
			}
			if len(op.KeyGroupRefs) > 0 {
				o.KeyGroups = maps.Clone(op.KeyGroups)
				if o.KeyGroups == nil {
					o.KeyGroups = map[int][]byte{}
				}
				for kg, r := range op.KeyGroupRefs {
					o.KeyGroups[kg] = got[r]
				}
			}
			o.StateRefs, o.KeyGroupRefs = nil, nil
			nt.Operators[i] = o
		}
		out.Tasks[id] = nt
	}
	return out, nil
}

// ReadRefs reads the bytes refs point to from st, verifying each one's
// CRC-32C: one ranged read per object, spanning the references into it. A
// missing or corrupt object is an error wrapping ErrStateUnreadable that
// names it.
func ReadRefs(ctx context.Context, st storage.Storage, refs []StateRef) (map[StateRef][]byte, error) {
	byKey := map[string][]StateRef{}
	for _, r := range refs {
		byKey[r.Key] = append(byKey[r.Key], r)
	}
	out := make(map[StateRef][]byte, len(refs))
	for _, key := range slices.Sorted(maps.Keys(byKey)) {
		rs := byKey[key]
		lo, hi := rs[0].Offset, rs[0].Offset+rs[0].Length
		for _, r := range rs[1:] {
			lo, hi = min(lo, r.Offset), max(hi, r.Offset+r.Length)
		}
		span, err := readSpan(ctx, st, key, lo, hi-lo)
		if err != nil {
			return nil, err
		}
		for _, r := range rs {
			b := span[r.Offset-lo : r.Offset-lo+r.Length]
			if got := crc32.Checksum(b, castagnoli); got != r.CRC {
				return nil, fmt.Errorf("%w: state object %s: %d bytes at offset %d have CRC-32C %08x, the checkpoint recorded %08x",
					ErrStateUnreadable, key, r.Length, r.Offset, got, r.CRC)
			}
			out[r] = b
		}
	}
	return out, nil
}

func readSpan(ctx context.Context, st storage.Storage, key string, off, n int64) ([]byte, error) {
	rc, err := st.Open(ctx, key, off, n)
	if err != nil {
		return nil, fmt.Errorf("%w: state object %s: %w", ErrStateUnreadable, key, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err == nil && int64(len(b)) != n {
		err = fmt.Errorf("%d bytes at offset %d, the checkpoint references %d: %w", len(b), off, n, io.ErrUnexpectedEOF)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: state object %s: %w", ErrStateUnreadable, key, err)
	}
	return b, nil
}

// BaseFrom is the base a task restored from state bytes continues from:
// each key group restored from a reference keeps it, with a hash of the
// bytes read, so that the first checkpoint after a restore writes only the
// key groups that changed.
func BaseFrom(uid string, refs map[int]StateRef, bytesOf func(kg int) []byte, into StateBase) StateBase {
	if len(refs) == 0 {
		return into
	}
	if into == nil {
		into = StateBase{}
	}
	for kg, r := range refs {
		into[baseKey{uid, kg}] = baseEntry{hash: xxhash.Sum64(bytesOf(kg)), ref: r}
	}
	return into
}

// SharedRegistry tracks which retained checkpoints of a job reference which
// objects of checkpoint storage (Flink's SharedStateRegistry): an object is
// live while one of them does. Its methods are safe for concurrent use.
type SharedRegistry struct {
	mu     sync.Mutex
	prefix string
	users  map[string]map[ID]struct{}
	byCP   map[ID][]string
}

// NewSharedRegistry tracks the objects of job.
func NewSharedRegistry(job string) *SharedRegistry {
	return &SharedRegistry{prefix: SharedPrefix(job), users: map[string]map[ID]struct{}{}, byCP: map[ID][]string{}}
}

// Check refuses a checkpoint that reuses an object (a reference written for
// an earlier checkpoint) no registered checkpoint references: that object
// may be deleted already, so the checkpoint must not complete. The error
// wraps ErrStaleReference and names the object.
func (r *SharedRegistry) Check(c Completed) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ref := range c.Refs() {
		if ref.Checkpoint > c.ID {
			return fmt.Errorf("%w: checkpoint %d references %s written for the later checkpoint %d", ErrStaleReference, c.ID, ref.Key, ref.Checkpoint)
		}
		if ref.Checkpoint == c.ID {
			continue
		}
		if _, ok := r.users[ref.Key]; !ok {
			return fmt.Errorf("%w: checkpoint %d reuses %s (written for checkpoint %d), which no retained checkpoint references any more",
				ErrStaleReference, c.ID, ref.Key, ref.Checkpoint)
		}
	}
	return nil
}

// Register records the objects c references.
func (r *SharedRegistry) Register(c Completed) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.byCP[c.ID]; ok {
		return
	}
	keys := map[string]struct{}{}
	for _, ref := range c.Refs() {
		keys[ref.Key] = struct{}{}
	}
	list := make([]string, 0, len(keys))
	for k := range keys {
		list = append(list, k)
		u := r.users[k]
		if u == nil {
			u = map[ID]struct{}{}
			r.users[k] = u
		}
		u[c.ID] = struct{}{}
	}
	r.byCP[c.ID] = list
}

// Retain forgets every registered checkpoint not in ids and returns the
// objects of the job (below SharedPrefix) no retained checkpoint references
// any more, sorted: the objects to delete.
func (r *SharedRegistry) Retain(ids []ID) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	keep := map[ID]bool{}
	for _, id := range ids {
		keep[id] = true
	}
	var unused []string
	for id, keys := range r.byCP {
		if keep[id] {
			continue
		}
		delete(r.byCP, id)
		for _, k := range keys {
			u := r.users[k]
			delete(u, id)
			if len(u) == 0 {
				delete(r.users, k)
				if strings.HasPrefix(k, r.prefix) {
					unused = append(unused, k)
				}
			}
		}
	}
	sort.Strings(unused)
	return unused
}

// Live reports whether a registered checkpoint references key.
func (r *SharedRegistry) Live(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.users[key]
	return ok
}

// Checkpoints returns the registered checkpoints, oldest first.
func (r *SharedRegistry) Checkpoints() []ID {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.byCP))
}

// Objects returns the number of live objects.
func (r *SharedRegistry) Objects() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.users)
}
