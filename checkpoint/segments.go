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
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"iter"
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
	// file names an immutable file of a native snapshot (kg is -1 then,
	// and the entry's hash is the file's size).
	file string
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
// written again. At most one object is written besides a native
// snapshot's files.
//
// The segment is the snapshot's bytes read in order as the upload asks for
// them, not a copy: a key group an operator's Encode produces is hashed
// and written while it is the one key group the task holds encoded. An
// error of Encode fails the upload (no object is written) and is wrapped
// by Write's error.
func (w *SegmentWriter) Write(ctx context.Context, id ID, snap TaskSnapshot, base StateBase) (out TaskSnapshot, next StateBase, written int64, err error) {
	native := slices.ContainsFunc(snap.Operators, func(o OperatorSnapshot) bool { return o.Native != nil && o.Native.Open != nil })
	if native {
		defer func() {
			for _, o := range snap.Operators {
				if o.Native != nil && o.Native.Release != nil {
					o.Native.Release()
				}
			}
		}()
	}
	var encErr error
	pull, stop := iter.Pull(snapshotParts(snap, &encErr))
	defer stop()
	// Up to the inline limit, the parts are held (copied if encoded): a
	// smaller snapshot stays inline.
	var held []segmentPart
	if !native {
		var total int64
		for total < w.inline {
			p, ok := pull()
			if !ok {
				if encErr != nil {
					return TaskSnapshot{}, nil, 0, fmt.Errorf("checkpoint %d of task %s: %w", id, snap.Task, encErr)
				}
				return inlineSnapshot(snap, held), nil, 0, nil
			}
			if p.encoded {
				p.b = slices.Clone(p.b)
			}
			held, total = append(held, p), total+int64(len(p.b))
		}
	}
	key, err := segmentKey(w.job, snap.Task, id)
	if err != nil {
		return TaskSnapshot{}, nil, 0, fmt.Errorf("checkpoint %d of task %s: %w", id, snap.Task, err)
	}
	next = StateBase{}
	out = TaskSnapshot{Task: snap.Task, Operators: make([]OperatorSnapshot, len(snap.Operators))}
	for i, op := range snap.Operators {
		o := op
		o.State, o.KeyGroups, o.Encode = nil, nil, nil
		o.StateRefs = slices.Clone(op.StateRefs)
		o.KeyGroupRefs = maps.Clone(op.KeyGroupRefs)
		if (len(op.KeyGroups) > 0 || op.Encode != nil) && o.KeyGroupRefs == nil {
			o.KeyGroupRefs = map[int]StateRef{}
		}
		out.Operators[i] = o
	}
	r := &segmentReader{held: held, pull: pull, err: &encErr}
	r.place = func(p segmentPart) bool {
		o := &out.Operators[p.op]
		ref := func() StateRef {
			ref := StateRef{Key: key, Offset: r.size, Length: int64(len(p.b)), CRC: crc32.Checksum(p.b, castagnoli), Checkpoint: id}
			r.size += ref.Length
			return ref
		}
		if p.kg < 0 {
			o.StateRefs = append(o.StateRefs, ref())
			return true
		}
		k := baseKey{uid: o.UID, kg: p.kg}
		h := xxhash.Sum64(p.b)
		if e, ok := base[k]; ok && e.hash == h && e.ref.Length == int64(len(p.b)) {
			o.KeyGroupRefs[p.kg] = e.ref
			next[k] = e
			return false
		}
		ref1 := ref()
		o.KeyGroupRefs[p.kg] = ref1
		next[k] = baseEntry{hash: h, ref: ref1}
		return true
	}
	// No object when every key group is reused.
	if r.advance() {
		if err := w.st.Put(ctx, key, r); err != nil || encErr != nil {
			if encErr != nil {
				err = encErr
			}
			return TaskSnapshot{}, nil, 0, fmt.Errorf("checkpoint %d of task %s: write state: %w", id, snap.Task, err)
		}
		if !r.done {
			return TaskSnapshot{}, nil, 0, fmt.Errorf("checkpoint %d of task %s: write state: %w", id, snap.Task, errSegmentUnread)
		}
	} else if encErr != nil {
		return TaskSnapshot{}, nil, 0, fmt.Errorf("checkpoint %d of task %s: %w", id, snap.Task, encErr)
	}
	written = r.size
	for i, op := range snap.Operators {
		if op.Native == nil || op.Native.Open == nil {
			continue
		}
		nat, n, err := w.writeNative(ctx, id, snap.Task, op.UID, op.Native, base, next)
		if err != nil {
			return TaskSnapshot{}, nil, 0, err
		}
		out.Operators[i].Native, written = nat, written+n
	}
	return out, next, written, nil
}

// errSegmentUnread is a storage's Put that returned before reading the
// whole segment.
var errSegmentUnread = errors.New("storage returned before reading the whole segment")

// segmentPart is one piece of a task's state in a segment: an operator
// state entry (kg -1) or a key group of operator op.
type segmentPart struct {
	op, kg int
	b      []byte
	// encoded: b is an Encode's, valid until the next part is pulled.
	encoded bool
}

// errPartsStopped ends an Encode when the parts are no longer pulled.
var errPartsStopped = errors.New("segment parts no longer read")

// snapshotParts yields the state of snap's operators in segment order:
// each operator's state entries, then its key groups in order (KeyGroups'
// and then Encode's). An Encode's error is put in *encErr and ends it.
func snapshotParts(snap TaskSnapshot, encErr *error) iter.Seq[segmentPart] {
	return func(yield func(segmentPart) bool) {
		for i, op := range snap.Operators {
			for _, e := range op.State {
				if !yield(segmentPart{op: i, kg: -1, b: e}) {
					return
				}
			}
			for _, kg := range slices.Sorted(maps.Keys(op.KeyGroups)) {
				if !yield(segmentPart{op: i, kg: kg, b: op.KeyGroups[kg]}) {
					return
				}
			}
			if op.Encode == nil {
				continue
			}
			err := op.Encode(func(kg int, b []byte) error {
				if !yield(segmentPart{op: i, kg: kg, b: b, encoded: true}) {
					return errPartsStopped
				}
				return nil
			})
			if err != nil {
				if !errors.Is(err, errPartsStopped) {
					*encErr = fmt.Errorf("encode the key groups of %s: %w", op.UID, err)
				}
				return
			}
		}
	}
}

// inlineSnapshot is snap with the key groups its operators' Encode
// produced (in held, copied) in their KeyGroups.
func inlineSnapshot(snap TaskSnapshot, held []segmentPart) TaskSnapshot {
	out := TaskSnapshot{Task: snap.Task, Operators: slices.Clone(snap.Operators)}
	for i := range out.Operators {
		o := &out.Operators[i]
		if o.Encode != nil {
			o.Encode, o.KeyGroups = nil, maps.Clone(o.KeyGroups)
		}
	}
	for _, p := range held {
		if p.encoded {
			o := &out.Operators[p.op]
			if o.KeyGroups == nil {
				o.KeyGroups = map[int][]byte{}
			}
			o.KeyGroups[p.kg] = p.b
		}
	}
	return out
}

// segmentReader is a segment's bytes as the storage reads them: the parts
// held, then the ones pulled, each placed (given its reference, or its
// base's) as it comes; the parts place says to write are read.
type segmentReader struct {
	held  []segmentPart
	pull  func() (segmentPart, bool)
	place func(segmentPart) bool
	err   *error // an Encode's
	cur   []byte // the rest of the part being read
	size  int64  // of the parts placed in the segment
	done  bool   // every part was read
}

// advance moves to the next part to write; false at the end (or on an
// Encode's error).
func (r *segmentReader) advance() bool {
	for {
		var p segmentPart
		if len(r.held) > 0 {
			p, r.held = r.held[0], r.held[1:]
		} else {
			var ok bool
			if p, ok = r.pull(); !ok {
				r.done = *r.err == nil
				return false
			}
		}
		if r.place(p) {
			r.cur = p.b
			return true
		}
	}
}

func (r *segmentReader) Read(b []byte) (int, error) {
	for len(r.cur) == 0 {
		if r.done {
			return 0, io.EOF
		}
		if !r.advance() {
			if err := *r.err; err != nil {
				return 0, err
			}
			return 0, io.EOF
		}
	}
	n := copy(b, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

// WriteTo writes the parts to w as they are, without a copy (io.Copy
// into a file).
func (r *segmentReader) WriteTo(w io.Writer) (int64, error) {
	var n int64
	for {
		if len(r.cur) > 0 {
			m, err := w.Write(r.cur)
			n += int64(m)
			r.cur = r.cur[m:]
			if err != nil {
				return n, err
			}
			continue
		}
		if r.done {
			return n, nil
		}
		if !r.advance() {
			return n, *r.err
		}
	}
}

// immutableNative says whether a native file never changes under its name
// (pebble's SSTs and blob files), so that a later checkpoint may
// reference the object an earlier one uploaded; the others (MANIFEST,
// OPTIONS, markers) are uploaded with every checkpoint.
func immutableNative(name string) bool {
	return strings.HasSuffix(name, ".sst") || strings.HasSuffix(name, ".blob")
}

// nativeBaseKey is the base's key of operator uid's native file name.
func nativeBaseKey(uid, name string) baseKey { return baseKey{uid: uid, kg: -1, file: name} }

// nativeBaseEntry is the base's entry of a native file uploaded as ref:
// a file is the same when its name and size are (immutableNative).
func nativeBaseEntry(ref StateRef) baseEntry { return baseEntry{hash: uint64(ref.Length), ref: ref} }

// writeNative uploads the files of nat not already in checkpoint storage
// (an immutable file of base with the same name and size is referenced
// again), each as an object of its own, and adds the immutable ones to
// next. It returns the native state to acknowledge with and the bytes
// uploaded.
func (w *SegmentWriter) writeNative(ctx context.Context, id ID, task TaskID, uid string, nat *NativeState, base, next StateBase) (*NativeState, int64, error) {
	out := &NativeState{Backend: nat.Backend, KeyGroupStart: nat.KeyGroupStart, KeyGroupEnd: nat.KeyGroupEnd, Meta: nat.Meta,
		Files: make([]NativeFile, len(nat.Files))}
	var r [8]byte
	if _, err := rand.Read(r[:]); err != nil {
		return nil, 0, fmt.Errorf("checkpoint %d of task %s: %w", id, task, err)
	}
	prefix := fmt.Sprintf("%s%s/%s/%d-%s-", SharedPrefix(w.job), keySegment(string(task)), keySegment(uid), id, hex.EncodeToString(r[:]))
	var put []int
	for i, f := range nat.Files {
		k := nativeBaseKey(uid, f.Name)
		if e, ok := base[k]; ok && immutableNative(f.Name) && e.hash == uint64(f.Ref.Length) {
			out.Files[i] = NativeFile{Name: f.Name, Ref: e.ref}
			next[k] = e
			continue
		}
		put = append(put, i)
	}
	err := Transfer(ctx, len(put), func(ctx context.Context, j int) error {
		f := nat.Files[put[j]]
		ref, err := w.putFile(ctx, prefix+keySegment(f.Name), id, f, nat.Open)
		out.Files[put[j]] = NativeFile{Name: f.Name, Ref: ref}
		return err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("checkpoint %d of task %s: native state of %s: %w", id, task, uid, err)
	}
	var written int64
	for _, i := range put {
		f := out.Files[i]
		written += f.Ref.Length
		if immutableNative(f.Name) {
			next[nativeBaseKey(uid, f.Name)] = nativeBaseEntry(f.Ref)
		}
	}
	return out, written, nil
}

// Transfers is how many files of one native snapshot Transfer moves to or
// from checkpoint storage at once (Flink's RocksDB backend transfers 4 at
// once by default, state.backend.rocksdb.checkpoint.transfer.thread.num).
const Transfers = 4

// Transfer calls fn for each of the n files of a native snapshot, at most
// Transfers at once, and returns the first error; once one failed, the
// context the others get is canceled and no further call starts. It
// returns after every call has.
func Transfer(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	sem := make(chan struct{}, Transfers)
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := fn(ctx, i); err != nil {
				once.Do(func() { first = err; cancel() })
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

// putFile uploads one native file as the object key, checking that it has
// the size the snapshot recorded.
func (w *SegmentWriter) putFile(ctx context.Context, key string, id ID, f NativeFile, open func(string) (io.ReadCloser, error)) (StateRef, error) {
	rc, err := open(f.Name)
	if err != nil {
		return StateRef{}, fmt.Errorf("read %s: %w", f.Name, err)
	}
	defer rc.Close()
	h := crc32.New(castagnoli)
	cr := &countingReader{r: io.TeeReader(rc, h)}
	if err := w.st.Put(ctx, key, cr); err != nil {
		return StateRef{}, fmt.Errorf("write %s: %w", key, err)
	}
	if cr.n != f.Ref.Length {
		return StateRef{}, fmt.Errorf("write %s: %s has %d bytes, the snapshot recorded %d", key, f.Name, cr.n, f.Ref.Length)
	}
	return StateRef{Key: key, Length: cr.n, CRC: h.Sum32(), Checkpoint: id}, nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// ReadNativeFile copies the native file f from st to w, verifying its
// length and CRC-32C. A missing or corrupt object is an error wrapping
// ErrStateUnreadable that names it.
func ReadNativeFile(ctx context.Context, st storage.Storage, f NativeFile, w io.Writer) error {
	rc, err := st.Open(ctx, f.Ref.Key, 0, -1)
	if err != nil {
		return fmt.Errorf("%w: state object %s (%s): %w", ErrStateUnreadable, f.Ref.Key, f.Name, err)
	}
	defer rc.Close()
	h := crc32.New(castagnoli)
	// Through a buffer of our own, hashed before w sees it: w may keep or
	// scribble over what it is given (pebble's invariant builds mangle
	// written buffers), which must be neither the storage's bytes nor
	// bytes not yet hashed.
	n, err := io.CopyBuffer(io.MultiWriter(h, w), struct{ io.Reader }{rc}, make([]byte, 256<<10))
	if err != nil {
		return fmt.Errorf("%w: state object %s (%s): %w", ErrStateUnreadable, f.Ref.Key, f.Name, err)
	}
	if n != f.Ref.Length || h.Sum32() != f.Ref.CRC {
		return fmt.Errorf("%w: state object %s (%s): %d bytes with CRC-32C %08x, the checkpoint recorded %d bytes with %08x",
			ErrStateUnreadable, f.Ref.Key, f.Name, n, h.Sum32(), f.Ref.Length, f.Ref.CRC)
	}
	return nil
}

// ErrNativeState is wrapped by Resolve's error for a checkpoint holding a
// native snapshot when it was given no NativeDecoder.
var ErrNativeState = errors.New("native state backend snapshot")

// ResolveOpt configures Resolve.
type ResolveOpt interface{ apply(*resolveCfg) }

type resolveCfg struct {
	decode func(context.Context, storage.Storage, *NativeState) (map[int][]byte, error)
}

type resolveOpt func(*resolveCfg)

func (o resolveOpt) apply(c *resolveCfg) { o(c) }

// NativeDecoder has Resolve turn each native snapshot (NativeState) into
// the canonical key groups decode returns (runtime.DecodeNativeState), so
// that what Resolve returns is backend-independent, as a savepoint must be.
func NativeDecoder(decode func(context.Context, storage.Storage, *NativeState) (map[int][]byte, error)) ResolveOpt {
	return resolveOpt(func(c *resolveCfg) { c.decode = decode })
}

// Resolve reads every referenced state of c from st back into the
// snapshots, so c holds its state inline (a self-contained checkpoint, as
// a savepoint must be). A missing or corrupt object is an error wrapping
// ErrStateUnreadable that names it. st may be nil when c references
// nothing; a c with references then fails, saying so. A native snapshot is
// decoded into canonical key groups with the NativeDecoder, and is an
// error wrapping ErrNativeState without one.
func Resolve(ctx context.Context, st storage.Storage, c Completed, opts ...ResolveOpt) (Completed, error) {
	var cfg resolveCfg
	for _, o := range opts {
		o.apply(&cfg)
	}
	var refs []StateRef
	native := false
	for _, t := range c.Tasks {
		for _, op := range t.Operators {
			refs = append(refs, op.StateRefs...)
			for _, r := range op.KeyGroupRefs {
				refs = append(refs, r)
			}
			native = native || op.Native != nil
		}
	}
	if len(refs) == 0 && !native {
		return c, nil
	}
	if st == nil {
		return Completed{}, fmt.Errorf("checkpoint %d of job %q references state in checkpoint storage, and none is configured (--checkpoint-storage)", c.ID, c.Job)
	}
	if native && cfg.decode == nil {
		return Completed{}, fmt.Errorf("checkpoint %d of job %q: %w: it holds native pebble state, which this reader cannot decode", c.ID, c.Job, ErrNativeState)
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
			if op.Native != nil {
				kgs, err := cfg.decode(ctx, st, op.Native)
				if err != nil {
					return Completed{}, fmt.Errorf("checkpoint %d of job %q: task %s operator %s: %w", c.ID, c.Job, id, op.UID, err)
				}
				o.KeyGroups = maps.Clone(op.KeyGroups)
				if o.KeyGroups == nil {
					o.KeyGroups = map[int][]byte{}
				}
				maps.Copy(o.KeyGroups, kgs)
				o.Native = nil
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
		into[baseKey{uid: uid, kg: kg}] = baseEntry{hash: xxhash.Sum64(bytesOf(kg)), ref: r}
	}
	return into
}

// Refs returns the objects b references, in no order.
func (b StateBase) Refs() []StateRef {
	refs := make([]StateRef, 0, len(b))
	for _, e := range b {
		refs = append(refs, e.ref)
	}
	return refs
}

// BaseFromNative is the base a task whose operator uid restored the native
// snapshot n continues from, added to into: each immutable file of n
// (immutableNative) keeps its object, so that the first checkpoint after
// the restore references the files the restored instance still holds
// instead of uploading them again. Only for the snapshot the instance
// opened on: a file name is an identity within one instance's lineage
// only.
func BaseFromNative(uid string, n *NativeState, into StateBase) StateBase {
	if n == nil {
		return into
	}
	if into == nil {
		into = StateBase{}
	}
	for _, f := range n.Files {
		if immutableNative(f.Name) && f.Ref.Key != "" {
			into[nativeBaseKey(uid, f.Name)] = nativeBaseEntry(f.Ref)
		}
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
