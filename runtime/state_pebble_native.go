package runtime

// Native checkpoints of the pebble backend (docs/guide/state-backends.md,
// docs/internals/checkpoint-storage.md). The synchronous part of a
// checkpoint flushes the instance's memtable and takes a pebble checkpoint
// (hard links of its SSTs, a copy of its MANIFEST and OPTIONS) into a
// staging directory next to the instance; the asynchronous part
// (checkpoint.SegmentWriter.Write, on the deployment's upload goroutine)
// uploads the files, each SST only once: an SST the task uploaded for an
// earlier completed checkpoint is referenced again. The handle
// (checkpoint.NativeState) carries the key groups the instance held and a
// description of its states (nativeMeta: name, kind and pebble id of
// each), so that a restore
//   - at the same key groups downloads the files into the new instance's
//     directory and opens pebble there, reading no key;
//   - at other key groups opens the old instance that overlaps most as the
//     base, excises the key groups the subtask does not own, and ingests
//     the owned key groups of each other overlapping instance as one new
//     SST (its live entries copied, not decoded);
//   - into the heap backend, or into a savepoint, decodes the files into
//     the canonical per-key-group blobs (DecodeNativeState).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
)

// The kinds of pebble states, as native snapshots record them.
const (
	pebbleKindValue       = "value"
	pebbleKindMap         = "map"
	pebbleKindList        = "list"
	pebbleKindEventTimers = "timers-event"
	pebbleKindProcTimers  = "timers-processing"
)

// nativeBackend is NativeState.Backend of pebble snapshots.
const nativeBackend = "pebble"

// pebbleStateInfo describes one state of a pebble instance.
type pebbleStateInfo struct {
	ID   uint16 `json:"id"`
	Name string `json:"name"`
	Kind string `json:"kind"`
	// Next is a list state's next sequence number.
	Next uint64 `json:"next,omitempty"`

	declared bool          // declared since the instance opened
	next     func() uint64 // a list's counter
}

// nativeMeta is NativeState.Meta of a pebble snapshot.
type nativeMeta struct {
	MaxParallelism int               `json:"max_parallelism"`
	States         []pebbleStateInfo `json:"states"`
}

// kgKey is the first pebble key of key group kg.
func kgKey(kg int) []byte { return appendStatePrefix(nil, kg, 0) }

// nativeSnapshot is the synchronous part of a native checkpoint: flush and
// a pebble checkpoint of the instance's key groups into a staging
// directory, released once uploaded (or with the instance).
func (p *pebbleState) nativeSnapshot(id checkpoint.ID) (*checkpoint.NativeState, error) {
	meta := nativeMeta{MaxParallelism: p.maxPar}
	for _, in := range p.infos {
		i := *in
		if in.next != nil {
			i.Next = in.next()
		}
		meta.States = append(meta.States, i)
	}
	slices.SortFunc(meta.States, func(a, b pebbleStateInfo) int { return int(a.ID) - int(b.ID) })
	mb, err := json.Marshal(meta)
	if err != nil {
		return nil, err
	}
	if err := p.writeBack(); err != nil {
		return nil, err
	}
	if err := p.db.Flush(); err != nil {
		return nil, fmt.Errorf("flush: %w", err)
	}
	fs := p.mem.fs
	dir := fmt.Sprintf("%s.cp-%d", p.dir, id)
	if err := fs.RemoveAll(dir); err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.staging[dir] = struct{}{}
	p.mu.Unlock()
	release := func() {
		p.mu.Lock()
		delete(p.staging, dir)
		p.mu.Unlock()
		_ = fs.RemoveAll(dir)
	}
	span := pebble.CheckpointSpan{Start: kgKey(p.kgLo), End: kgKey(p.kgHi)}
	if p.kgHi >= 1<<16 {
		span.End = []byte{0xff, 0xff, 0xff, 0xff, 0xff}
	}
	if err := p.db.Checkpoint(dir, pebble.WithFlushedWAL(), pebble.WithRestrictToSpans([]pebble.CheckpointSpan{span})); err != nil {
		release()
		return nil, fmt.Errorf("pebble checkpoint: %w", err)
	}
	names, err := fs.List(dir)
	if err != nil {
		release()
		return nil, err
	}
	slices.Sort(names)
	n := &checkpoint.NativeState{Backend: nativeBackend, KeyGroupStart: p.kgLo, KeyGroupEnd: p.kgHi, Meta: mb,
		Open:    func(name string) (io.ReadCloser, error) { return fs.Open(fs.PathJoin(dir, name)) },
		Release: release}
	for _, name := range names {
		st, err := fs.Stat(fs.PathJoin(dir, name))
		if err != nil {
			release()
			return nil, err
		}
		if st.IsDir() {
			continue
		}
		n.Files = append(n.Files, checkpoint.NativeFile{Name: name, Ref: checkpoint.StateRef{Length: st.Size()}})
	}
	return n, nil
}

// downloadNative writes the files of n into dir on fs, checkpoint.Transfers
// at once.
func downloadNative(ctx context.Context, st storage.Storage, fs vfs.FS, n *checkpoint.NativeState, dir string) error {
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range n.Files {
		if strings.ContainsAny(f.Name, `/\`) || f.Name == ".." || f.Name == "." || f.Name == "" {
			return fmt.Errorf("%w: native state file name %q", checkpoint.ErrStateUnreadable, f.Name)
		}
	}
	return checkpoint.Transfer(ctx, len(n.Files), func(ctx context.Context, i int) error {
		f := n.Files[i]
		w, err := fs.Create(fs.PathJoin(dir, f.Name), vfs.WriteCategoryUnspecified)
		if err != nil {
			return err
		}
		err = checkpoint.ReadNativeFile(ctx, st, f, w)
		if err == nil {
			err = w.Sync()
		}
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		return err
	})
}

// parseNativeMeta reads a pebble native snapshot's meta.
func parseNativeMeta(n *checkpoint.NativeState) (nativeMeta, error) {
	var m nativeMeta
	if n.Backend != nativeBackend {
		return m, fmt.Errorf("%w: native state of backend %q, not %q", ErrIncompatibleState, n.Backend, nativeBackend)
	}
	if err := json.Unmarshal(n.Meta, &m); err != nil {
		return m, fmt.Errorf("%w: native state meta: %w", checkpoint.ErrStateUnreadable, err)
	}
	return m, nil
}

// sameStates says whether two native snapshots number their states alike.
func sameStates(a, b nativeMeta) bool {
	if len(a.States) != len(b.States) {
		return false
	}
	for i := range a.States {
		x, y := a.States[i], b.States[i]
		if x.ID != y.ID || x.Name != y.Name || x.Kind != y.Kind {
			return false
		}
	}
	return true
}

// errNativeMismatch: the overlapping native snapshots number their states
// differently; the restore decodes them instead.
var errNativeMismatch = errors.New("native snapshots number their states differently")

// openNative fills the new instance's directory dir from the native
// snapshots overlapping the key groups [lo, hi) and opens pebble there
// with opts. It returns the instance and the states' meta.
func openNative(ctx context.Context, st storage.Storage, fs vfs.FS, dir string, opts *pebble.Options, handles []*checkpoint.NativeState, lo, hi int) (*pebble.DB, nativeMeta, error) {
	base, metas, err := nativeBase(handles, lo, hi)
	if err != nil {
		return nil, nativeMeta{}, err
	}
	if err := downloadNative(ctx, st, fs, handles[base], dir); err != nil {
		return nil, nativeMeta{}, err
	}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		return nil, nativeMeta{}, fmt.Errorf("%w: open native state of key groups [%d, %d): %w", checkpoint.ErrStateUnreadable, handles[base].KeyGroupStart, handles[base].KeyGroupEnd, err)
	}
	fail := func(err error) (*pebble.DB, nativeMeta, error) {
		_ = db.Close()
		return nil, nativeMeta{}, err
	}
	// Drop what the subtask does not own.
	b := handles[base]
	if b.KeyGroupStart < lo {
		if err := db.Excise(ctx, pebble.KeyRange{Start: kgKey(b.KeyGroupStart), End: kgKey(lo)}); err != nil {
			return fail(fmt.Errorf("excise key groups [%d, %d): %w", b.KeyGroupStart, lo, err))
		}
	}
	if b.KeyGroupEnd > hi {
		if err := db.Excise(ctx, pebble.KeyRange{Start: kgKey(hi), End: kgKey(b.KeyGroupEnd)}); err != nil {
			return fail(fmt.Errorf("excise key groups [%d, %d): %w", hi, b.KeyGroupEnd, err))
		}
	}
	meta := metas[base]
	for i, n := range handles {
		if i == base {
			continue
		}
		if err := ingestNative(ctx, st, fs, db, opts, dir, n, max(lo, n.KeyGroupStart), min(hi, n.KeyGroupEnd)); err != nil {
			return fail(err)
		}
		for j := range meta.States {
			meta.States[j].Next = max(meta.States[j].Next, metas[i].States[j].Next)
		}
	}
	return db, meta, nil
}

// nativeBase chooses, of the native snapshots handles restored into the
// key groups [lo, hi), the one a new instance opens on (the one that
// overlaps most; openNative), and returns the index of it and the meta of
// each. errNativeMismatch: the snapshots' states do not line up (the
// subtask restores them decoded instead).
func nativeBase(handles []*checkpoint.NativeState, lo, hi int) (int, []nativeMeta, error) {
	var metas []nativeMeta
	base := -1
	overlap := func(n *checkpoint.NativeState) int { return min(hi, n.KeyGroupEnd) - max(lo, n.KeyGroupStart) }
	for i, n := range handles {
		m, err := parseNativeMeta(n)
		if err != nil {
			return -1, nil, err
		}
		if len(metas) > 0 && !sameStates(metas[0], m) {
			return -1, nil, errNativeMismatch
		}
		metas = append(metas, m)
		if base < 0 || overlap(n) > overlap(handles[base]) {
			base = i
		}
	}
	return base, metas, nil
}

// nativeRestoreBase adds to into the files a pebble instance restored from
// handles into the key groups [lo, hi) holds as they are in checkpoint
// storage: the immutable files of the snapshot it opens on (nativeBase),
// which its first checkpoint then references instead of uploading them
// again (Flink's incremental RocksDB restore keeps its shared files the
// same way). Nothing is added when the instance would not open on them
// (no handle, states that do not line up, an unreadable meta): a file of
// another snapshot, or of a decoded restore, may have the same name and
// other bytes.
func nativeRestoreBase(uid string, handles []*checkpoint.NativeState, lo, hi int, into checkpoint.StateBase) checkpoint.StateBase {
	if len(handles) == 0 || lo >= hi {
		return into
	}
	base, _, err := nativeBase(handles, lo, hi)
	if err != nil {
		return into
	}
	return checkpoint.BaseFromNative(uid, handles[base], into)
}

// ingestNative ingests the key groups [lo, hi) of native snapshot n into
// db: n's files are opened as a pebble instance of their own in a scratch
// directory, the range's live entries written to one SST, which db
// ingests.
func ingestNative(ctx context.Context, st storage.Storage, fs vfs.FS, db *pebble.DB, opts *pebble.Options, dir string, n *checkpoint.NativeState, lo, hi int) error {
	scratch := fmt.Sprintf("%s.in-%d", dir, n.KeyGroupStart)
	defer func() { _ = fs.RemoveAll(scratch) }()
	if err := downloadNative(ctx, st, fs, n, scratch); err != nil {
		return err
	}
	src, err := pebble.Open(scratch, &pebble.Options{FS: fs, DisableWAL: true, Logger: quietLogger{}})
	if err != nil {
		return fmt.Errorf("%w: open native state of key groups [%d, %d): %w", checkpoint.ErrStateUnreadable, n.KeyGroupStart, n.KeyGroupEnd, err)
	}
	defer src.Close()
	it, err := src.NewIter(&pebble.IterOptions{LowerBound: kgKey(lo), UpperBound: kgKey(hi)})
	if err != nil {
		return err
	}
	defer it.Close()
	path := scratch + ".sst"
	defer func() { _ = fs.Remove(path) }()
	f, err := fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	wopts := opts.Clone()
	wopts.EnsureDefaults()
	w := sstable.NewWriter(objstorageprovider.NewFileWritable(f), wopts.MakeWriterOptions(0, db.TableFormat()))
	any := false
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			_ = w.Close()
			return err
		}
		if err := w.Set(it.Key(), v); err != nil {
			_ = w.Close()
			return err
		}
		any = true
	}
	if err := it.Error(); err != nil {
		_ = w.Close()
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	if !any {
		return nil
	}
	if err := db.Ingest(ctx, []string{path}); err != nil {
		return fmt.Errorf("ingest key groups [%d, %d): %w", lo, hi, err)
	}
	return nil
}

// DecodeNativeState decodes a native snapshot of the pebble backend into
// the canonical per-key-group blobs (checkpoint.NativeDecoder): what a
// savepoint holds, and what a heap backend restores. It downloads the
// files into a scratch directory and reads them with pebble there.
func DecodeNativeState(ctx context.Context, st storage.Storage, n *checkpoint.NativeState) (map[int][]byte, error) {
	meta, err := parseNativeMeta(n)
	if err != nil {
		return nil, err
	}
	if st == nil {
		return nil, fmt.Errorf("native state in checkpoint storage, and none is configured")
	}
	dir, err := os.MkdirTemp("", "weir-native-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := downloadNative(ctx, st, vfs.Default, n, dir); err != nil {
		return nil, err
	}
	db, err := pebble.Open(dir, &pebble.Options{DisableWAL: true, Logger: quietLogger{}})
	if err != nil {
		return nil, fmt.Errorf("%w: open native state: %w", checkpoint.ErrStateUnreadable, err)
	}
	defer db.Close()
	return decodeNative(db, meta)
}

// decodeNative encodes the canonical blobs of every state of meta in r.
func decodeNative(r pebbleReader, meta nativeMeta) (map[int][]byte, error) {
	var frozen []frozenState
	var names []string
	timers := map[string]*frozenTimerService{}
	blobs := func(enc func(pebbleReader, int, uint16) (map[int][]byte, error), sid uint16) frozenState {
		return &frozenBlobs{enc: func() (map[int][]byte, error) { return enc(r, meta.MaxParallelism, sid) }}
	}
	for _, in := range meta.States {
		switch in.Kind {
		case pebbleKindValue:
			frozen, names = append(frozen, blobs(encodeValueBlobs, in.ID)), append(names, in.Name)
		case pebbleKindMap:
			frozen, names = append(frozen, blobs(encodeMapBlobs, in.ID)), append(names, in.Name)
		case pebbleKindList:
			frozen, names = append(frozen, blobs(encodeListBlobs, in.ID)), append(names, in.Name)
		case pebbleKindEventTimers, pebbleKindProcTimers:
			f := timers[in.Name]
			if f == nil {
				f = &frozenTimerService{ev: &frozenPebbleTimers{enc: noTimers}, pr: &frozenPebbleTimers{enc: noTimers}}
				timers[in.Name] = f
				frozen, names = append(frozen, f), append(names, "\x00timers/"+in.Name)
			}
			sid := in.ID
			ft := &frozenPebbleTimers{enc: func() (map[int][]pebbleTimerID, error) { return encodeTimerIDs(r, meta.MaxParallelism, sid) }}
			if in.Kind == pebbleKindEventTimers {
				f.ev = ft
			} else {
				f.pr = ft
			}
		default:
			return nil, fmt.Errorf("%w: native state %q of unknown kind %q", checkpoint.ErrStateUnreadable, in.Name, in.Kind)
		}
	}
	return combineFrozen(frozen, names, nil)
}

func noTimers() (map[int][]pebbleTimerID, error) { return nil, nil }

// quietLogger drops what pebble logs about scratch instances.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

// reload rebuilds the head of each key group's queue after a native
// restore: each key group's cache emptied and refilled from its start.
func (t *pebbleTimers) reload() {
	clear(t.known)
	for kg := range t.caches {
		t.caches[kg] = timerCache{}
		t.kbuf = appendStatePrefix(t.kbuf[:0], kg, t.sid)
		t.refill(kg)
	}
	t.min = -2
}
