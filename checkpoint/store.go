package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"go.uber.org/zap"
)

// Store layout.
//
// Everything lives in one pebble keyspace:
//
//	weir/checkpoint-store               store marker; value: store format version (1 byte)
//	cp/<job>\x00<id: 8 bytes BE>m       metadata + state record of checkpoint <id>
//	cp/<job>\x00<id: 8 bytes BE>h       transaction-handles record of checkpoint <id>
//	hw/<job>                            id high-water mark: the highest id NextID may have returned
//
// Ids are big-endian, so a job's checkpoints sort oldest first and the newest is
// the last key under "cp/<job>\x00". A job name is therefore any non-empty
// string without a NUL byte.
//
// Every record value is
//
//	[format: 1 byte][crc32c: 4 bytes little-endian][payload]
//
// where the CRC32C (Castagnoli) covers the key, the format byte and the
// payload, so a value that ends up under the wrong key also fails
// verification. The meta payload begins with a header (job, id, times, size,
// stats) that List decodes without decoding the task state behind it. The
// handles record holds every TxnHandle of the checkpoint, keyed by task and
// operator index; on decode they are put back into the operators.
const (
	storeMarkerKey = "weir/checkpoint-store"
	storeFormat    = 1
	// recordFormat is the format byte of the records Save writes. Format 2
	// added each operator's max parallelism to the meta record and each
	// entry's operator UID to the handles record; format 1 records are still
	// read (max parallelism 0: unknown, UIDs empty). Format 3 added each
	// operator's references to state in checkpoint storage (StateRefs,
	// KeyGroupRefs) to the meta record; older records have none. Format 4
	// added each operator's native snapshot (NativeState). Format 5 added
	// each operator's watermark (a source subtask's, at the barrier).
	recordFormat    = 5
	minRecordFormat = 1

	recMeta    = 'm'
	recHandles = 'h'

	headerSize = 5 // format byte + crc32c
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrStoreClosed is returned by every method of a closed Store.
var ErrStoreClosed = errors.New("checkpoint store closed")

// ErrNotAStore is wrapped by OpenStore errors when the directory holds
// something other than a Weir checkpoint store.
var ErrNotAStore = errors.New("not a weir checkpoint store")

// ErrStoreFailed is wrapped by errors after pebble reported a fatal error
// (e.g. its write-ahead log could not be written or synced). The outcome of the
// write in flight is unknown: it may or may not be durable. The Store refuses
// every later call; close it and open the directory again to learn what was
// persisted. Such errors also wrap ErrOutcomeUnknown.
var ErrStoreFailed = errors.New("checkpoint store failed")

// CorruptError describes a checkpoint record that fails its checksum or cannot
// be decoded. It matches ErrCorrupt with errors.Is.
type CorruptError struct {
	Job string
	ID  ID
	// Record is "meta" (metadata and state), "handles" or "high-water mark".
	Record string
	Err    error
}

func (e *CorruptError) Error() string {
	if e.Record == "high-water mark" {
		return fmt.Sprintf("checkpoint store: job %q: %s record corrupt: %v", e.Job, e.Record, e.Err)
	}
	return fmt.Sprintf("checkpoint store: job %q checkpoint %d: %s record corrupt: %v", e.Job, e.ID, e.Record, e.Err)
}

// Unwrap returns ErrCorrupt and the underlying cause.
func (e *CorruptError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrCorrupt}
	}
	return []error{ErrCorrupt, e.Err}
}

// Summary describes one stored checkpoint without its state.
type Summary struct {
	ID          ID
	TriggeredAt time.Time
	CompletedAt time.Time
	Duration    time.Duration
	// Size is the number of state bytes (Completed.Size at save time).
	Size  int64
	Stats map[TaskID]TaskStats
	// Err is non-nil (and wraps ErrCorrupt) when the checkpoint's records fail
	// verification; then only ID is meaningful.
	Err error
}

// Skipped is a checkpoint newer than the one LatestUsable returned, passed
// over because it failed verification.
type Skipped struct {
	ID ID
	// Err is the corruption error (it wraps ErrCorrupt).
	Err error
	// Handles are the checkpoint's transaction handles, valid only if
	// HandlesOK: the handles record is stored apart from the state and may
	// still verify when the state does not.
	Handles   []TxnHandle
	HandlesOK bool
	// Owners says which operator subtask pre-committed which of Handles
	// (valid only if HandlesOK), so a restore can give them to the operator
	// that knows how to commit them.
	Owners []HandleOwner
}

// HandleOwner names the operator subtask that pre-committed Handles. UID is
// empty for checkpoints written by a store format that did not record it.
type HandleOwner struct {
	Task    TaskID
	UID     string
	Handles []TxnHandle
}

// StoreOpt configures OpenStore.
type StoreOpt interface{ apply(*storeConfig) }

type storeOpt struct{ fn func(*storeConfig) }

func (o storeOpt) apply(c *storeConfig) { o.fn(c) }

type storeConfig struct {
	fs       vfs.FS
	retained int
	idBlock  int
	log      *zap.Logger
	write    *pebble.WriteOptions // pebble.Sync, but in memory
	readOnly bool
	// noLog turns pebble's write-ahead log off (InMemory): its memtable
	// holds what the log would, and both go with the process.
	noLog bool
}

// InMemory keeps the store in memory (vfs.NewMem): nothing survives the
// process, so writes are not synced (a sync there is a hand-off to pebble's
// log writer goroutine and back, 1-10 ms of a checkpoint's cycle on a busy
// machine, that makes nothing durable), and pebble keeps no write-ahead log
// (a copy of every saved checkpoint into a growing in-memory file, about
// 8% of the CPU of a job checkpointing a few hundred KB every 100 ms, that
// nothing could ever replay). The mini cluster without a checkpoint
// directory and a job manager without a data directory use it.
func InMemory() StoreOpt {
	return storeOpt{func(c *storeConfig) { c.fs, c.write, c.noLog = vfs.NewMem(), pebble.NoSync, true }}
}

// WithFS sets the filesystem pebble uses, by default the OS filesystem
// (vfs.Default), with synced writes. Tests use vfs.NewCrashableMem or
// vfs/errorfs.
func WithFS(fs vfs.FS) StoreOpt {
	return storeOpt{func(c *storeConfig) { c.fs, c.write = fs, pebble.Sync }}
}

// ReadOnly opens an existing store for reading only (streamctl savepoint
// inspect and state dump): nothing is created or written, and Save, NextID
// and DeleteJob fail. A store another process has open (a running job
// manager or streamctl run) fails with ErrStoreLocked: pebble locks its
// directory even for readers.
func ReadOnly() StoreOpt { return storeOpt{func(c *storeConfig) { c.readOnly = true }} }

// ErrStoreLocked is wrapped by OpenStore's error when another process (or
// another Store in this one) has the store open.
var ErrStoreLocked = errors.New("checkpoint store in use")

// WithRetained sets how many completed checkpoints Save keeps per job, by
// default 3. Older ones are deleted, with their state, in the batch that saves
// the new one. n must be at least 1.
func WithRetained(n int) StoreOpt { return storeOpt{func(c *storeConfig) { c.retained = n }} }

// WithIDBlock sets how many checkpoint ids NextID reserves with one synced
// write of the job's high-water mark, by default 1 (one sync per id). With a
// block of n, a restart skips at most n-1 ids: ids stay strictly increasing
// but may have gaps. n must be at least 1.
func WithIDBlock(n int) StoreOpt { return storeOpt{func(c *storeConfig) { c.idBlock = n }} }

// WithLogger sets the logger for the store and for pebble's own messages, by
// default a no-op logger.
func WithLogger(l *zap.Logger) StoreOpt { return storeOpt{func(c *storeConfig) { c.log = l }} }

// Store is the durable store of completed checkpoints, built on pebble.
//
// Save is the commit point of a job's distributed transaction: it writes the
// checkpoint in one synced pebble batch, so after a crash a checkpoint is
// either entirely there or not at all. A Store is safe for concurrent use;
// writes (Save, NextID, DeleteJob) are serialized.
//
// When a write-ahead-log write or sync fails, pebble treats the database as
// broken (it calls its logger's Fatalf, which by default exits the process).
// The Store instead returns an error wrapping ErrStoreFailed and
// ErrOutcomeUnknown from the call that hit it, and refuses every later call
// but Close: the write may or may not be durable, and only a reopen tells.
type Store struct {
	db  *pebble.DB
	dir string
	cfg storeConfig
	log *zap.Logger

	// life guards closed against use: every method holds it for reading
	// while it uses db, Close holds it for writing.
	life   sync.RWMutex
	closed bool

	// wmu serializes writes and guards ids and saved.
	wmu sync.Mutex
	ids map[string]*idRange
	// saved caches the ids of each job's stored checkpoints, oldest first,
	// for Save: listing them (jobIDs) steps over the records of the
	// checkpoints Save deleted until pebble compacts them away, reading and
	// decompressing their blocks, most of a Save's time under load. Save
	// keeps it; DeleteJob, Reopen and a failed Save (a write in doubt) drop
	// it.
	saved map[string][]ID

	// failed holds the error that made the store unusable, if any.
	failed atomic.Pointer[error]
}

// idRange is the part of a job's reserved id block not yet handed out:
// next..limit; limit is what is persisted as the high-water mark.
type idRange struct {
	next, limit uint64
}

// OpenStore opens (or creates) the checkpoint store in dir.
//
// An empty or missing directory becomes a new store. A directory that holds
// files other than pebble's, or a pebble database that is not a checkpoint
// store, gives an error wrapping ErrNotAStore; a damaged one gives the error
// pebble reports.
func OpenStore(dir string, opts ...StoreOpt) (s *Store, err error) {
	cfg := storeConfig{fs: vfs.Default, retained: 3, idBlock: 1, log: zap.NewNop(), write: pebble.Sync}
	for _, o := range opts {
		o.apply(&cfg)
	}
	if cfg.retained < 1 {
		return nil, fmt.Errorf("open checkpoint store %s: retained must be >= 1, got %d", dir, cfg.retained)
	}
	if cfg.idBlock < 1 {
		return nil, fmt.Errorf("open checkpoint store %s: id block must be >= 1, got %d", dir, cfg.idBlock)
	}
	if cfg.fs == nil || cfg.log == nil {
		return nil, fmt.Errorf("open checkpoint store %s: nil filesystem or logger", dir)
	}
	db, err := openDB(dir, cfg)
	if err != nil {
		return nil, err
	}
	return &Store{db: db, dir: dir, cfg: cfg, log: cfg.log, ids: make(map[string]*idRange), saved: make(map[string][]ID)}, nil
}

// openDB opens the pebble database of a store in dir and checks (or writes)
// its marker.
func openDB(dir string, cfg storeConfig) (db *pebble.DB, err error) {
	fs := cfg.fs
	if cfg.readOnly {
		if _, err := fs.Stat(dir); err != nil {
			return nil, fmt.Errorf("open checkpoint store %s: %w", dir, err)
		}
		if desc, err := pebble.Peek(dir, fs); err != nil {
			return nil, fmt.Errorf("open checkpoint store %s: %w", dir, err)
		} else if !desc.Exists {
			return nil, fmt.Errorf("open checkpoint store %s: %w: no pebble database", dir, ErrNotAStore)
		}
		lock, err := pebble.LockDirectory(dir, fs)
		if err != nil {
			return nil, fmt.Errorf("open checkpoint store %s: %w (a running job manager or streamctl run has it open): %v", dir, ErrStoreLocked, err)
		}
		if err := lock.Close(); err != nil {
			return nil, fmt.Errorf("open checkpoint store %s: %w", dir, err)
		}
	} else if err := fs.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("open checkpoint store %s: %w", dir, err)
	}
	names, err := fs.List(dir)
	if err != nil {
		return nil, fmt.Errorf("open checkpoint store %s: %w", dir, err)
	}
	if len(names) > 0 {
		desc, err := pebble.Peek(dir, fs)
		if err != nil {
			return nil, fmt.Errorf("open checkpoint store %s: %w", dir, err)
		}
		if !desc.Exists {
			for _, n := range names {
				if !isPebbleFile(n) {
					return nil, fmt.Errorf("open checkpoint store %s: %w: no pebble database, and it holds %q", dir, ErrNotAStore, n)
				}
			}
		}
	}

	defer func() {
		if r := recover(); r != nil {
			pf, ok := r.(*pebbleFatal)
			if !ok {
				panic(r)
			}
			db, err = nil, fmt.Errorf("open checkpoint store %s: %w", dir, pf)
		}
	}()
	db, err = pebble.Open(dir, &pebble.Options{FS: fs, Logger: pebbleLogger{cfg.log}, ReadOnly: cfg.readOnly, DisableWAL: cfg.noLog})
	if err != nil {
		return nil, fmt.Errorf("open checkpoint store %s: %w", dir, err)
	}
	write := cfg.write
	if cfg.readOnly {
		write = nil
	}
	if err := checkMarker(db, write); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open checkpoint store %s: %w", dir, err)
	}
	return db, nil
}

// Reopen makes a store that failed (ErrStoreFailed: a write whose outcome is
// unknown) usable again: it closes the database and opens the directory
// again, so that what pebble recovers, the write in doubt included or not,
// decides. On a store that has not failed it does nothing. An executor calls
// it before restoring after a failover, and then restores from what the
// store holds.
func (s *Store) Reopen() (err error) {
	s.wmu.Lock() // the order of Save: writes, then life
	defer s.wmu.Unlock()
	s.life.Lock()
	defer s.life.Unlock()
	if s.closed {
		return ErrStoreClosed
	}
	failed := s.failed.Load()
	if failed == nil {
		return nil
	}
	func() {
		// The failed database may fail again on close; what it did not
		// sync is what a crash would have lost.
		defer func() { _ = recover() }()
		if s.cfg.noLog {
			// Without a log, what is not flushed is lost on close.
			_ = s.db.Flush()
		}
		_ = s.db.Close()
	}()
	db, err := openDB(s.dir, s.cfg)
	if err != nil {
		return fmt.Errorf("reopen failed checkpoint store (%w): %w", *failed, err)
	}
	s.db = db
	s.ids = make(map[string]*idRange)
	s.saved = make(map[string][]ID)
	s.failed.Store(nil)
	s.log.Warn("checkpoint store reopened after a failure", zap.NamedError("failure", *failed))
	return nil
}

// isPebbleFile reports whether name is a file pebble itself creates, so that a
// directory in which pebble's first open was interrupted is not mistaken for
// a foreign one.
func isPebbleFile(name string) bool {
	switch name {
	case "LOCK", "CURRENT":
		return true
	}
	for _, p := range []string{"MANIFEST-", "OPTIONS-", "marker.", "temporary.", "CURRENT."} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	for _, sfx := range []string{".log", ".sst", ".blob", ".dbtmp"} {
		if strings.HasSuffix(name, sfx) {
			return true
		}
	}
	return false
}

// checkMarker checks, or on a new database writes, the store marker (write
// nil: a read-only store, which writes nothing).
func checkMarker(db *pebble.DB, write *pebble.WriteOptions) error {
	v, closer, err := db.Get([]byte(storeMarkerKey))
	switch {
	case err == nil:
		defer closer.Close()
		if len(v) != 1 || v[0] != storeFormat {
			return fmt.Errorf("%w: unsupported store format %x", ErrNotAStore, v)
		}
		return nil
	case !errors.Is(err, pebble.ErrNotFound):
		return err
	}
	it, err := db.NewIter(nil)
	if err != nil {
		return err
	}
	nonEmpty := it.First()
	var key []byte
	if nonEmpty {
		key = slices.Clone(it.Key())
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return err
	}
	if nonEmpty {
		return fmt.Errorf("%w: pebble database without store marker (first key %q)", ErrNotAStore, key)
	}
	if write == nil { // read-only
		return fmt.Errorf("%w: empty pebble database", ErrNotAStore)
	}
	return db.Set([]byte(storeMarkerKey), []byte{storeFormat}, write)
}

// Close closes the store. Later calls of any method return ErrStoreClosed;
// Close itself may be called again and then returns nil.
func (s *Store) Close() (err error) {
	s.life.Lock()
	defer s.life.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	defer s.catchFatal(&err)
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close checkpoint store: %w", err)
	}
	return nil
}

// use takes the read side of life and checks the store is usable.
func (s *Store) use(ctx context.Context) (release func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.life.RLock()
	if s.closed {
		s.life.RUnlock()
		return nil, ErrStoreClosed
	}
	if f := s.failed.Load(); f != nil {
		s.life.RUnlock()
		return nil, *f
	}
	return s.life.RUnlock, nil
}

// catchFatal turns a pebble fatal error (see pebbleLogger) raised in this
// goroutine into an error and marks the store failed. It must be deferred
// directly.
func (s *Store) catchFatal(err *error) {
	r := recover()
	if r == nil {
		return
	}
	pf, ok := r.(*pebbleFatal)
	if !ok {
		panic(r)
	}
	e := fmt.Errorf("%w (%w): %w", ErrStoreFailed, ErrOutcomeUnknown, pf)
	s.failed.CompareAndSwap(nil, &e)
	s.log.Error("checkpoint store failed", zap.Error(e))
	*err = e
}

// Save writes c as the newest completed checkpoint of c.Job in one synced
// pebble batch, the commit point of the checkpoint. The same batch deletes the
// job's checkpoints beyond the retained number, state included. Save refuses
// an id not greater than the job's latest saved id (the error wraps
// ErrIDNotIncreasing).
//
// If Save returns an error wrapping ErrStoreFailed the outcome is unknown and
// the store must be reopened; any other error means nothing was written.
func (s *Store) Save(ctx context.Context, c Completed) (err error) {
	if err := checkJob(c.Job); err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	if c.ID == 0 {
		return fmt.Errorf("save checkpoint of job %q: id 0 is not a checkpoint", c.Job)
	}
	meta, handles, err := encodeCompleted(c)
	if err != nil {
		return fmt.Errorf("save checkpoint %d of job %q: %w", c.ID, c.Job, err)
	}

	s.wmu.Lock()
	defer s.wmu.Unlock()
	release, err := s.use(ctx)
	if err != nil {
		return fmt.Errorf("save checkpoint %d of job %q: %w", c.ID, c.Job, err)
	}
	defer release()
	defer func() { // after catchFatal made a panic err
		if err != nil {
			delete(s.saved, c.Job) // the write may or may not have happened
		}
	}()
	defer s.catchFatal(&err)

	ids, err := s.savedIDs(c.Job)
	if err != nil {
		return fmt.Errorf("save checkpoint %d of job %q: %w", c.ID, c.Job, err)
	}
	if n := len(ids); n > 0 && c.ID <= ids[n-1] {
		return fmt.Errorf("save checkpoint %d of job %q: %w: latest saved is %d", c.ID, c.Job, ErrIDNotIncreasing, ids[n-1])
	}

	b := s.db.NewBatch()
	defer b.Close()
	mk, hk := cpKey(c.Job, c.ID, recMeta), cpKey(c.Job, c.ID, recHandles)
	if err := errors.Join(b.Set(mk, sealRecord(mk, meta), nil), b.Set(hk, sealRecord(hk, handles), nil)); err != nil {
		return fmt.Errorf("save checkpoint %d of job %q: %w", c.ID, c.Job, err)
	}
	var dropped []ID
	if keep := s.cfg.retained - 1; len(ids) > keep {
		dropped = ids[:len(ids)-keep]
		for _, id := range dropped {
			if err := errors.Join(b.Delete(cpKey(c.Job, id, recMeta), nil), b.Delete(cpKey(c.Job, id, recHandles), nil)); err != nil {
				return fmt.Errorf("save checkpoint %d of job %q: %w", c.ID, c.Job, err)
			}
		}
	}
	if err := s.db.Apply(b, s.cfg.write); err != nil {
		return fmt.Errorf("save checkpoint %d of job %q: %w", c.ID, c.Job, err)
	}
	s.saved[c.Job] = append(slices.Clip(ids[len(dropped):]), c.ID)
	if r := s.ids[c.Job]; r != nil && uint64(c.ID) >= r.next {
		r.next = uint64(c.ID) + 1
	}
	s.log.Debug("checkpoint saved", zap.String("job", c.Job), zap.Uint64("id", uint64(c.ID)),
		zap.Int("bytes", len(meta)+len(handles)), zap.Int("dropped", len(dropped)))
	return nil
}

// Latest returns the newest completed checkpoint of job. It returns an error
// wrapping ErrNotFound when the job has none, and an error wrapping ErrCorrupt
// (a *CorruptError naming the job and checkpoint) when the newest one fails
// verification: it never silently falls back to an older one. Use
// LatestUsable to fall back deliberately.
func (s *Store) Latest(ctx context.Context, job string) (Completed, error) {
	if err := checkJob(job); err != nil {
		return Completed{}, fmt.Errorf("latest checkpoint: %w", err)
	}
	release, err := s.use(ctx)
	if err != nil {
		return Completed{}, fmt.Errorf("latest checkpoint of job %q: %w", job, err)
	}
	defer release()
	var (
		c     Completed
		found bool
	)
	err = s.scan(ctx, job, func(r rawCheckpoint) (bool, error) {
		found = true
		var err error
		c, err = r.decode(job)
		return false, err
	})
	if err != nil {
		return Completed{}, fmt.Errorf("latest checkpoint of job %q: %w", job, err)
	}
	if !found {
		return Completed{}, fmt.Errorf("latest checkpoint of job %q: %w", job, ErrNotFound)
	}
	return c, nil
}

// LatestUsable returns the newest completed checkpoint of job that verifies,
// and every newer one it skipped because it did not.
//
// Falling back is a deliberate loss of exactness. A skipped checkpoint was
// committed: Save returned for it, notifications may have gone out, and its
// transactions may already be visible downstream. The caller must therefore
// COMMIT each skipped checkpoint's handles (idempotently, as on any restore),
// never abort them, and then restore state from the older checkpoint c. State
// falls back to c while the outputs of the skipped checkpoints stay visible,
// so the records between c and the newest skipped checkpoint are processed
// again: for that window the job is at-least-once, not exactly-once. This is
// why handles are stored in a record apart from the state: a damaged state
// record must not take with it the ability to finish transactions that were
// already committed at the checkpoint's commit point. A skipped checkpoint
// whose handles record is damaged too has HandlesOK false; its transactions
// can then only be found by other means (or expire at the broker).
//
// The error wraps ErrNotFound if no checkpoint of job verifies (and also
// ErrCorrupt if some exist).
func (s *Store) LatestUsable(ctx context.Context, job string) (c Completed, skipped []Skipped, err error) {
	if err := checkJob(job); err != nil {
		return Completed{}, nil, fmt.Errorf("latest usable checkpoint: %w", err)
	}
	release, err := s.use(ctx)
	if err != nil {
		return Completed{}, nil, fmt.Errorf("latest usable checkpoint of job %q: %w", job, err)
	}
	defer release()
	var found bool
	err = s.scan(ctx, job, func(r rawCheckpoint) (bool, error) {
		got, err := r.decode(job)
		if err == nil {
			c, found = got, true
			return false, nil
		}
		sk := r.skipped(job, err)
		skipped = append(skipped, sk)
		s.log.Warn("skipping corrupt checkpoint", zap.String("job", job), zap.Uint64("id", uint64(r.id)),
			zap.Bool("handles_ok", sk.HandlesOK), zap.Error(err))
		return true, nil
	})
	if err != nil {
		return Completed{}, skipped, fmt.Errorf("latest usable checkpoint of job %q: %w", job, err)
	}
	if !found {
		if len(skipped) > 0 {
			return Completed{}, skipped, fmt.Errorf("latest usable checkpoint of job %q: %w: all %d stored checkpoints are %w",
				job, ErrNotFound, len(skipped), ErrCorrupt)
		}
		return Completed{}, nil, fmt.Errorf("latest usable checkpoint of job %q: %w", job, ErrNotFound)
	}
	return c, skipped, nil
}

// Get returns checkpoint id of job: an error wrapping ErrNotFound if it is not
// stored, ErrCorrupt if it fails verification.
func (s *Store) Get(ctx context.Context, job string, id ID) (Completed, error) {
	if err := checkJob(job); err != nil {
		return Completed{}, fmt.Errorf("get checkpoint %d: %w", id, err)
	}
	release, err := s.use(ctx)
	if err != nil {
		return Completed{}, fmt.Errorf("get checkpoint %d of job %q: %w", id, job, err)
	}
	defer release()
	r := rawCheckpoint{id: id}
	if r.meta, err = s.get(cpKey(job, id, recMeta)); err != nil {
		return Completed{}, fmt.Errorf("get checkpoint %d of job %q: %w", id, job, err)
	}
	if r.handles, err = s.get(cpKey(job, id, recHandles)); err != nil {
		return Completed{}, fmt.Errorf("get checkpoint %d of job %q: %w", id, job, err)
	}
	if r.meta == nil && r.handles == nil {
		return Completed{}, fmt.Errorf("get checkpoint %d of job %q: %w", id, job, ErrNotFound)
	}
	c, err := r.decode(job)
	if err != nil {
		return Completed{}, fmt.Errorf("get checkpoint %d of job %q: %w", id, job, err)
	}
	return c, nil
}

// List returns a summary of every stored checkpoint of job, newest first. It
// verifies each checkpoint's checksums but decodes only the metadata header,
// not the state. A checkpoint that fails verification is listed with Err set.
func (s *Store) List(ctx context.Context, job string) ([]Summary, error) {
	if err := checkJob(job); err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", err)
	}
	release, err := s.use(ctx)
	if err != nil {
		return nil, fmt.Errorf("list checkpoints of job %q: %w", job, err)
	}
	defer release()
	var out []Summary
	err = s.scan(ctx, job, func(r rawCheckpoint) (bool, error) {
		sum, err := r.summary(job)
		if err != nil {
			sum = Summary{ID: r.id, Err: err}
		}
		out = append(out, sum)
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list checkpoints of job %q: %w", job, err)
	}
	return out, nil
}

// NextID returns a new checkpoint id for job, greater than every id NextID
// ever returned for it (across restarts, whether or not that checkpoint was
// completed) and than every id saved for it. Before returning, it syncs the
// job's high-water mark; with WithIDBlock(n) one sync reserves n ids, so ids
// after a restart may skip up to n-1 values.
func (s *Store) NextID(ctx context.Context, job string) (id ID, err error) {
	if err := checkJob(job); err != nil {
		return 0, fmt.Errorf("next checkpoint id: %w", err)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	release, err := s.use(ctx)
	if err != nil {
		return 0, fmt.Errorf("next checkpoint id of job %q: %w", job, err)
	}
	defer release()
	defer s.catchFatal(&err)

	r := s.ids[job]
	if r == nil {
		base, err := s.idFloor(job)
		if err != nil {
			return 0, fmt.Errorf("next checkpoint id of job %q: %w", job, err)
		}
		r = &idRange{next: base + 1, limit: base}
		s.ids[job] = r
	}
	if r.next == 0 {
		return 0, fmt.Errorf("next checkpoint id of job %q: ids exhausted", job)
	}
	if r.next > r.limit {
		limit := r.next - 1 + uint64(s.cfg.idBlock)
		if limit < r.next {
			limit = ^uint64(0)
		}
		k := hwKey(job)
		if err := s.db.Set(k, sealRecord(k, binary.AppendUvarint(nil, limit)), s.cfg.write); err != nil {
			return 0, fmt.Errorf("next checkpoint id of job %q: %w", job, err)
		}
		r.limit = limit
	}
	id = ID(r.next)
	r.next++
	return id, nil
}

// idFloor is the greatest id that may already be in use for job: the larger
// of the persisted high-water mark and the newest saved checkpoint id.
func (s *Store) idFloor(job string) (uint64, error) {
	hw, err := s.readHW(job)
	if err != nil {
		return 0, err
	}
	ids, err := s.jobIDs(job)
	if err != nil {
		return 0, err
	}
	if n := len(ids); n > 0 && uint64(ids[n-1]) > hw {
		hw = uint64(ids[n-1])
	}
	return hw, nil
}

func (s *Store) readHW(job string) (uint64, error) {
	k := hwKey(job)
	v, err := s.get(k)
	if err != nil || v == nil {
		return 0, err
	}
	corrupt := func(err error) error { return &CorruptError{Job: job, Record: "high-water mark", Err: err} }
	_, p, err := openRecord(k, v)
	if err != nil {
		return 0, corrupt(err)
	}
	hw, n := binary.Uvarint(p)
	if n <= 0 || n != len(p) {
		return 0, corrupt(errors.New("bad varint"))
	}
	return hw, nil
}

// DeleteJob deletes every checkpoint of job in one synced batch. It keeps the
// job's id high-water mark (a few bytes, raised to cover the deleted ids), so
// that ids stay strictly increasing if the job name is ever used again.
func (s *Store) DeleteJob(ctx context.Context, job string) (err error) {
	if err := checkJob(job); err != nil {
		return fmt.Errorf("delete job: %w", err)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	release, err := s.use(ctx)
	if err != nil {
		return fmt.Errorf("delete job %q: %w", job, err)
	}
	defer release()
	defer s.catchFatal(&err)

	hw, err := s.idFloor(job)
	if err != nil && !errors.Is(err, ErrCorrupt) {
		return fmt.Errorf("delete job %q: %w", job, err)
	}
	if err != nil {
		// A corrupt high-water mark must not block deletion; keep at least
		// the saved ids covered.
		ids, ierr := s.jobIDs(job)
		if ierr != nil {
			return fmt.Errorf("delete job %q: %w", job, ierr)
		}
		hw = 0
		if n := len(ids); n > 0 {
			hw = uint64(ids[n-1])
		}
	}
	if r := s.ids[job]; r != nil && r.limit > hw {
		hw = r.limit
	}
	lo, hi := jobBounds(job)
	b := s.db.NewBatch()
	defer b.Close()
	k := hwKey(job)
	if err := errors.Join(b.DeleteRange(lo, hi, nil), b.Set(k, sealRecord(k, binary.AppendUvarint(nil, hw)), nil)); err != nil {
		return fmt.Errorf("delete job %q: %w", job, err)
	}
	delete(s.saved, job)
	if err := s.db.Apply(b, s.cfg.write); err != nil {
		return fmt.Errorf("delete job %q: %w", job, err)
	}
	if r := s.ids[job]; r != nil {
		r.limit = hw
	}
	return nil
}

// get returns a copy of the value of k, nil if absent.
func (s *Store) get(k []byte) ([]byte, error) {
	v, closer, err := s.db.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	return slices.Clone(v), nil
}

// savedIDs is jobIDs for a writer (under wmu), from the cache when it has
// the job. The caller must not change the slice.
func (s *Store) savedIDs(job string) ([]ID, error) {
	if ids, ok := s.saved[job]; ok {
		return ids, nil
	}
	ids, err := s.jobIDs(job)
	if err == nil {
		s.saved[job] = ids
	}
	return ids, err
}

// jobIDs returns the ids of the job's stored checkpoints, oldest first.
func (s *Store) jobIDs(job string) ([]ID, error) {
	lo, hi := jobBounds(job)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return nil, err
	}
	var ids []ID
	for ok := it.First(); ok; ok = it.Next() {
		id, _, ok := parseCPKey(it.Key(), len(lo))
		if !ok {
			continue
		}
		if n := len(ids); n == 0 || ids[n-1] != id {
			ids = append(ids, id)
		}
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return nil, err
	}
	return ids, nil
}

// rawCheckpoint is the undecoded pair of records of one checkpoint; a nil
// record is missing.
type rawCheckpoint struct {
	id            ID
	meta, handles []byte
}

// scan calls fn for each stored checkpoint of job, newest first, from one
// consistent iterator, until fn returns false or an error.
func (s *Store) scan(ctx context.Context, job string, fn func(rawCheckpoint) (bool, error)) error {
	lo, hi := jobBounds(job)
	it, err := s.db.NewIterWithContext(ctx, &pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	var (
		cur     rawCheckpoint
		have    bool
		stopped bool
		cbErr   error
	)
	flush := func() bool {
		if !have {
			return true
		}
		have = false
		if err := ctx.Err(); err != nil {
			cbErr = err
			return false
		}
		more, err := fn(cur)
		if err != nil {
			cbErr = err
			return false
		}
		return more
	}
	for ok := it.Last(); ok; ok = it.Prev() {
		id, kind, ok := parseCPKey(it.Key(), len(lo))
		if !ok {
			continue
		}
		if have && id != cur.id {
			if !flush() {
				stopped = true
				break
			}
		}
		if !have {
			cur, have = rawCheckpoint{id: id}, true
		}
		v, err := it.ValueAndErr()
		if err != nil {
			cbErr = err
			stopped = true
			break
		}
		switch kind {
		case recMeta:
			cur.meta = slices.Clone(v)
		case recHandles:
			cur.handles = slices.Clone(v)
		}
	}
	if !stopped {
		flush()
	}
	return errors.Join(cbErr, it.Error(), it.Close())
}

func (r rawCheckpoint) corrupt(job, rec string, err error) error {
	return &CorruptError{Job: job, ID: r.id, Record: rec, Err: err}
}

// skipped describes r, passed over by a restore because of err, with its
// handles if they verify.
func (r rawCheckpoint) skipped(job string, err error) Skipped {
	sk := Skipped{ID: r.id, Err: err}
	if hs, herr := r.decodeHandles(job); herr == nil {
		sk.HandlesOK = true
		for _, e := range hs {
			sk.Handles = append(sk.Handles, e.handles...)
			sk.Owners = append(sk.Owners, HandleOwner{Task: e.task, UID: e.uid, Handles: e.handles})
		}
	}
	return sk
}

func (r rawCheckpoint) decode(job string) (Completed, error) {
	hs, err := r.decodeHandles(job)
	if err != nil {
		return Completed{}, err
	}
	if r.meta == nil {
		return Completed{}, r.corrupt(job, "meta", errors.New("record missing"))
	}
	format, p, err := openRecord(cpKey(job, r.id, recMeta), r.meta)
	if err != nil {
		return Completed{}, r.corrupt(job, "meta", err)
	}
	c, err := decodeMeta(p, format, job, r.id, hs)
	if err != nil {
		return Completed{}, r.corrupt(job, "meta", err)
	}
	return c, nil
}

func (r rawCheckpoint) decodeHandles(job string) ([]handleEntry, error) {
	if r.handles == nil {
		return nil, r.corrupt(job, "handles", errors.New("record missing"))
	}
	format, p, err := openRecord(cpKey(job, r.id, recHandles), r.handles)
	if err != nil {
		return nil, r.corrupt(job, "handles", err)
	}
	hs, err := decodeHandles(p, format, job, r.id)
	if err != nil {
		return nil, r.corrupt(job, "handles", err)
	}
	return hs, nil
}

func (r rawCheckpoint) summary(job string) (Summary, error) {
	if _, err := r.decodeHandles(job); err != nil {
		return Summary{}, err
	}
	if r.meta == nil {
		return Summary{}, r.corrupt(job, "meta", errors.New("record missing"))
	}
	_, p, err := openRecord(cpKey(job, r.id, recMeta), r.meta)
	if err != nil {
		return Summary{}, r.corrupt(job, "meta", err)
	}
	d := &decoder{b: p}
	h := d.header(job, r.id)
	if d.err != nil {
		return Summary{}, r.corrupt(job, "meta", d.err)
	}
	return Summary{
		ID:          r.id,
		TriggeredAt: h.triggered,
		CompletedAt: h.completed,
		Duration:    h.completed.Sub(h.triggered),
		Size:        h.size,
		Stats:       h.stats,
	}, nil
}

// Keys.

func checkJob(job string) error {
	if job == "" {
		return errors.New("empty job name")
	}
	if strings.IndexByte(job, 0) >= 0 {
		return fmt.Errorf("job name %q contains a NUL byte", job)
	}
	return nil
}

func jobBounds(job string) (lo, hi []byte) {
	lo = append(append([]byte("cp/"), job...), 0)
	hi = append(append([]byte("cp/"), job...), 1)
	return lo, hi
}

func cpKey(job string, id ID, kind byte) []byte {
	k, _ := jobBounds(job)
	k = binary.BigEndian.AppendUint64(k, uint64(id))
	return append(k, kind)
}

func parseCPKey(k []byte, prefixLen int) (ID, byte, bool) {
	if len(k) != prefixLen+9 {
		return 0, 0, false
	}
	kind := k[prefixLen+8]
	if kind != recMeta && kind != recHandles {
		return 0, 0, false
	}
	return ID(binary.BigEndian.Uint64(k[prefixLen:])), kind, true
}

func hwKey(job string) []byte { return append([]byte("hw/"), job...) }

// Records.

func recordCRC(key []byte, format byte, payload []byte) uint32 {
	crc := crc32.Update(0, castagnoli, key)
	crc = crc32.Update(crc, castagnoli, []byte{format})
	return crc32.Update(crc, castagnoli, payload)
}

func sealRecord(key, payload []byte) []byte {
	v := make([]byte, headerSize, headerSize+len(payload))
	v[0] = recordFormat
	binary.LittleEndian.PutUint32(v[1:], recordCRC(key, recordFormat, payload))
	return append(v, payload...)
}

// openRecord verifies a record and returns its format byte and payload.
func openRecord(key, v []byte) (byte, []byte, error) {
	if len(v) < headerSize {
		return 0, nil, fmt.Errorf("record too short (%d bytes)", len(v))
	}
	payload := v[headerSize:]
	if got, want := recordCRC(key, v[0], payload), binary.LittleEndian.Uint32(v[1:]); got != want {
		return 0, nil, fmt.Errorf("checksum mismatch: computed %08x, stored %08x", got, want)
	}
	if v[0] < minRecordFormat || v[0] > recordFormat {
		return 0, nil, fmt.Errorf("unsupported record format %d", v[0])
	}
	return v[0], payload, nil
}

// handleEntry is the handles of one operator of one task.
type handleEntry struct {
	task    TaskID
	op      int
	uid     string // "" in format 1
	handles []TxnHandle
}

func sortedTasks(c Completed) []TaskID {
	ts := make([]TaskID, 0, len(c.Tasks))
	for t := range c.Tasks {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	return ts
}

// encodeCompleted returns the payloads of the meta and handles records.
func encodeCompleted(c Completed) (meta, handles []byte, err error) {
	// The state's bytes are most of the meta record: sized for them at
	// once, it is not copied again each time it grows (a checkpoint of a
	// few hundred KB every 100 ms was a few percent of a busy job's CPU).
	m := encoder{b: make([]byte, 0, metaSize(c))}
	m.str(c.Job)
	m.uvarint(uint64(c.ID))
	if err := m.time(c.TriggeredAt); err != nil {
		return nil, nil, fmt.Errorf("triggered_at: %w", err)
	}
	if err := m.time(c.CompletedAt); err != nil {
		return nil, nil, fmt.Errorf("completed_at: %w", err)
	}
	m.varint(c.Size())
	stats := make([]TaskID, 0, len(c.Stats))
	for t := range c.Stats {
		stats = append(stats, t)
	}
	slices.Sort(stats)
	m.uvarint(uint64(len(stats)))
	for _, t := range stats {
		st := c.Stats[t]
		m.str(string(t))
		m.varint(int64(st.AckLatency))
		m.varint(int64(st.Alignment))
		m.varint(st.Size)
	}

	var h encoder
	h.str(c.Job)
	h.uvarint(uint64(c.ID))
	var entries []handleEntry

	tasks := sortedTasks(c)
	m.uvarint(uint64(len(tasks)))
	for _, t := range tasks {
		ts := c.Tasks[t]
		if ts.Task != "" && ts.Task != t {
			return nil, nil, fmt.Errorf("task %q: snapshot names task %q", t, ts.Task)
		}
		m.str(string(t))
		m.uvarint(uint64(len(ts.Operators)))
		for i, op := range ts.Operators {
			m.str(op.UID)
			m.varint(int64(op.Subtask))
			m.varint(int64(op.Parallelism))
			m.varint(int64(op.MaxParallelism))
			m.uvarint(uint64(len(op.State)))
			for _, e := range op.State {
				m.bytes(e)
			}
			kgs := make([]int, 0, len(op.KeyGroups))
			for kg := range op.KeyGroups {
				kgs = append(kgs, kg)
			}
			sort.Ints(kgs)
			m.uvarint(uint64(len(kgs)))
			for _, kg := range kgs {
				m.varint(int64(kg))
				m.bytes(op.KeyGroups[kg])
			}
			m.uvarint(uint64(len(op.StateRefs)))
			for _, r := range op.StateRefs {
				m.ref(r)
			}
			kgs = kgs[:0]
			for kg := range op.KeyGroupRefs {
				kgs = append(kgs, kg)
			}
			sort.Ints(kgs)
			m.uvarint(uint64(len(kgs)))
			for _, kg := range kgs {
				m.varint(int64(kg))
				m.ref(op.KeyGroupRefs[kg])
			}
			if n := op.Native; n == nil {
				m.uvarint(0)
			} else {
				m.uvarint(1)
				m.str(n.Backend)
				m.varint(int64(n.KeyGroupStart))
				m.varint(int64(n.KeyGroupEnd))
				m.bytes(n.Meta)
				m.uvarint(uint64(len(n.Files)))
				for _, f := range n.Files {
					m.str(f.Name)
					m.ref(f.Ref)
				}
			}
			m.uvarint(uint64(len(op.Handles)))
			if op.Watermark == nil {
				m.uvarint(0)
			} else {
				m.uvarint(1)
				m.varint(*op.Watermark)
			}
			if len(op.Handles) > 0 {
				entries = append(entries, handleEntry{task: t, op: i, uid: op.UID, handles: op.Handles})
			}
		}
	}
	h.uvarint(uint64(len(entries)))
	for _, e := range entries {
		h.str(string(e.task))
		h.uvarint(uint64(e.op))
		h.str(e.uid)
		h.uvarint(uint64(len(e.handles)))
		for _, th := range e.handles {
			h.str(th.TransactionalID)
			h.varint(th.ProducerID)
			h.varint(int64(th.Epoch))
			h.uvarint(uint64(th.Checkpoint))
		}
	}
	// Handle partitions follow as an optional section, so records written
	// before it existed still decode: a tag, then per handle in the order
	// above, its partitions.
	if hasHandlePartitions(entries) {
		h.b = append(h.b, handlePartitionsTag)
		for _, e := range entries {
			for _, th := range e.handles {
				h.uvarint(uint64(len(th.Partitions)))
				for _, p := range th.Partitions {
					h.str(p.Topic)
					h.varint(int64(p.Partition))
					h.varint(p.FirstOffset)
				}
			}
		}
	}
	return m.b, h.b, nil
}

// handlePartitionsTag starts the optional section of the handles record
// holding each handle's partitions.
const handlePartitionsTag = 'p'

func hasHandlePartitions(entries []handleEntry) bool {
	for _, e := range entries {
		for _, th := range e.handles {
			if len(th.Partitions) > 0 {
				return true
			}
		}
	}
	return false
}

type metaHeader struct {
	triggered, completed time.Time
	size                 int64
	stats                map[TaskID]TaskStats
}

func decodeMeta(p []byte, format byte, job string, id ID, hs []handleEntry) (Completed, error) {
	d := &decoder{b: p}
	h := d.header(job, id)
	c := Completed{Job: job, ID: id, TriggeredAt: h.triggered, CompletedAt: h.completed, Stats: h.stats}
	nTasks := d.count()
	if nTasks > 0 {
		c.Tasks = make(map[TaskID]TaskSnapshot, nTasks)
	}
	wantHandles := make(map[TaskID][]int, nTasks)
	for i := 0; i < nTasks && d.err == nil; i++ {
		t := TaskID(d.str())
		ts := TaskSnapshot{Task: t}
		nOps := d.count()
		if nOps > 0 {
			ts.Operators = make([]OperatorSnapshot, nOps)
		}
		want := make([]int, nOps)
		for j := 0; j < nOps && d.err == nil; j++ {
			op := &ts.Operators[j]
			op.UID = d.str()
			op.Subtask = int(d.varint())
			op.Parallelism = int(d.varint())
			if format >= 2 {
				op.MaxParallelism = int(d.varint())
			}
			if n := d.count(); n > 0 {
				op.State = make([][]byte, n)
				for k := range op.State {
					op.State[k] = d.bytes()
				}
			}
			if n := d.count(); n > 0 {
				op.KeyGroups = make(map[int][]byte, n)
				for k := 0; k < n && d.err == nil; k++ {
					kg := int(d.varint())
					op.KeyGroups[kg] = d.bytes()
				}
			}
			if format >= 3 {
				if n := d.count(); n > 0 {
					op.StateRefs = make([]StateRef, n)
					for k := range op.StateRefs {
						op.StateRefs[k] = d.ref()
					}
				}
				if n := d.count(); n > 0 {
					op.KeyGroupRefs = make(map[int]StateRef, n)
					for k := 0; k < n && d.err == nil; k++ {
						kg := int(d.varint())
						if _, dup := op.KeyGroupRefs[kg]; dup || op.KeyGroups[kg] != nil {
							d.fail(fmt.Errorf("key group %d twice", kg))
						}
						op.KeyGroupRefs[kg] = d.ref()
					}
				}
			}
			if format >= 4 && d.uvarint() == 1 {
				n := &NativeState{Backend: d.str(), KeyGroupStart: int(d.varint()), KeyGroupEnd: int(d.varint()), Meta: d.bytes()}
				if k := d.count(); k > 0 {
					n.Files = make([]NativeFile, k)
					for f := range n.Files {
						n.Files[f] = NativeFile{Name: d.str(), Ref: d.ref()}
					}
				}
				op.Native = n
			}
			// The handles themselves are in the handles record, so this
			// count is not bounded by the bytes left here.
			if n := d.uvarint(); n > 1<<31 {
				d.fail(fmt.Errorf("handle count %d", n))
			} else {
				want[j] = int(n)
			}
			if format >= 5 && d.uvarint() == 1 {
				wm := d.varint()
				op.Watermark = &wm
			}
		}
		if _, dup := c.Tasks[t]; dup && d.err == nil {
			d.fail(fmt.Errorf("task %q twice", t))
		}
		c.Tasks[t] = ts
		wantHandles[t] = want
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail(fmt.Errorf("%d trailing bytes", len(d.b)))
	}
	if d.err != nil {
		return Completed{}, d.err
	}
	if c.Size() != h.size {
		return Completed{}, fmt.Errorf("state size %d, header says %d", c.Size(), h.size)
	}
	for _, e := range hs {
		ts, ok := c.Tasks[e.task]
		if !ok || e.op >= len(ts.Operators) {
			return Completed{}, fmt.Errorf("handles for unknown operator %d of task %q", e.op, e.task)
		}
		if e.uid != "" && e.uid != ts.Operators[e.op].UID {
			return Completed{}, fmt.Errorf("task %q operator %d: handles of uid %q, state of uid %q", e.task, e.op, e.uid, ts.Operators[e.op].UID)
		}
		if got, want := len(e.handles), wantHandles[e.task][e.op]; got != want || ts.Operators[e.op].Handles != nil {
			return Completed{}, fmt.Errorf("task %q operator %d: %d handles stored, %d expected", e.task, e.op, got, want)
		}
		ts.Operators[e.op].Handles = e.handles
		wantHandles[e.task][e.op] = 0
	}
	for t, want := range wantHandles {
		for j, n := range want {
			if n != 0 {
				return Completed{}, fmt.Errorf("task %q operator %d: %d handles missing", t, j, n)
			}
		}
	}
	return c, nil
}

func decodeHandles(p []byte, format byte, job string, id ID) ([]handleEntry, error) {
	d := &decoder{b: p}
	d.ident(job, id)
	n := d.count()
	var out []handleEntry
	for i := 0; i < n && d.err == nil; i++ {
		e := handleEntry{task: TaskID(d.str()), op: d.count()}
		if format >= 2 {
			e.uid = d.str()
		}
		m := d.count()
		for j := 0; j < m && d.err == nil; j++ {
			e.handles = append(e.handles, TxnHandle{
				TransactionalID: d.str(),
				ProducerID:      d.varint(),
				Epoch:           int16(d.varint()),
				Checkpoint:      ID(d.uvarint()),
			})
		}
		out = append(out, e)
	}
	if d.err == nil && len(d.b) != 0 && d.b[0] == handlePartitionsTag {
		d.b = d.b[1:]
		for i := range out {
			for j := range out[i].handles {
				m := d.count()
				for k := 0; k < m && d.err == nil; k++ {
					out[i].handles[j].Partitions = append(out[i].handles[j].Partitions, TxnPartition{
						Topic: d.str(), Partition: int32(d.varint()), FirstOffset: d.varint(),
					})
				}
			}
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail(fmt.Errorf("%d trailing bytes", len(d.b)))
	}
	return out, d.err
}

type encoder struct{ b []byte }

// metaSize is about the size of c's meta record: the state bytes it holds
// inline (not those of its references, which stay in checkpoint storage)
// and a guess for the rest (names, numbers, lengths); the encoder grows
// past it if needed.
func metaSize(c Completed) int {
	n := 256 + 64*len(c.Stats)
	for _, t := range c.Tasks {
		n += 64 * (1 + len(t.Operators))
		for _, op := range t.Operators {
			for _, e := range op.State {
				n += 16 + len(e)
			}
			for _, kg := range op.KeyGroups {
				n += 16 + len(kg)
			}
			n += 64 * len(op.StateRefs)
		}
	}
	return n
}

func (e *encoder) uvarint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) varint(v int64)   { e.b = binary.AppendVarint(e.b, v) }
func (e *encoder) bytes(p []byte)   { e.uvarint(uint64(len(p))); e.b = append(e.b, p...) }
func (e *encoder) str(s string)     { e.uvarint(uint64(len(s))); e.b = append(e.b, s...) }

func (e *encoder) ref(r StateRef) {
	e.str(r.Key)
	e.uvarint(uint64(r.Offset))
	e.uvarint(uint64(r.Length))
	e.uvarint(uint64(r.CRC))
	e.uvarint(uint64(r.Checkpoint))
}

func (e *encoder) time(t time.Time) error {
	p, err := t.MarshalBinary()
	if err != nil {
		return err
	}
	e.bytes(p)
	return nil
}

// decoder reads what encoder wrote; after the first error every read returns
// zero values and err keeps that error.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail(io.ErrUnexpectedEOF)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail(io.ErrUnexpectedEOF)
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a length that cannot exceed the remaining bytes (every counted
// element takes at least one byte), so corrupt input cannot make it allocate
// without bound.
func (d *decoder) count() int {
	v := d.uvarint()
	if v > uint64(len(d.b)) {
		d.fail(fmt.Errorf("count %d exceeds remaining %d bytes", v, len(d.b)))
		return 0
	}
	return int(v)
}

// bytes returns the next length-prefixed byte string, aliasing the input;
// empty decodes as nil.
func (d *decoder) bytes() []byte {
	n := d.count()
	if d.err != nil || n == 0 {
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

func (d *decoder) str() string { return string(d.bytes()) }

func (d *decoder) ref() StateRef {
	r := StateRef{Key: d.str()}
	off, n, crc := d.uvarint(), d.uvarint(), d.uvarint()
	if d.err == nil && (off > math.MaxInt64 || n > math.MaxInt64 || crc > math.MaxUint32) {
		d.fail(fmt.Errorf("state reference %q: offset %d, length %d, crc %d out of range", r.Key, off, n, crc))
	}
	r.Offset, r.Length, r.CRC = int64(off), int64(n), uint32(crc)
	r.Checkpoint = ID(d.uvarint())
	return r
}

func (d *decoder) time() time.Time {
	p := d.bytes()
	if d.err != nil {
		return time.Time{}
	}
	var t time.Time
	if err := t.UnmarshalBinary(p); err != nil {
		d.fail(err)
	}
	return t
}

func (d *decoder) ident(job string, id ID) {
	gotJob, gotID := d.str(), ID(d.uvarint())
	if d.err == nil && (gotJob != job || gotID != id) {
		d.fail(fmt.Errorf("record is of job %q checkpoint %d", gotJob, gotID))
	}
}

func (d *decoder) header(job string, id ID) metaHeader {
	d.ident(job, id)
	var h metaHeader
	h.triggered = d.time()
	h.completed = d.time()
	h.size = d.varint()
	if n := d.count(); n > 0 {
		h.stats = make(map[TaskID]TaskStats, n)
		for i := 0; i < n && d.err == nil; i++ {
			t := TaskID(d.str())
			h.stats[t] = TaskStats{
				AckLatency: time.Duration(d.varint()),
				Alignment:  time.Duration(d.varint()),
				Size:       d.varint(),
			}
		}
	}
	return h
}

// pebbleFatal is what pebbleLogger.Fatalf panics with. Pebble calls Fatalf
// when it cannot go on (e.g. a write-ahead-log write or sync failed under a
// commit) and its default logger exits the process; a Fatalf that returned
// would let the commit look successful. The Store recovers this panic in the
// goroutine that made the failing call and turns it into ErrStoreFailed. A
// Fatalf in one of pebble's background goroutines cannot be recovered and
// ends the process, as pebble's default logger would.
type pebbleFatal struct {
	msg   string
	cause error
}

func (p *pebbleFatal) Error() string {
	if strings.HasPrefix(p.msg, "pebble") {
		return p.msg
	}
	return "pebble: " + p.msg
}
func (p *pebbleFatal) Unwrap() error { return p.cause }

// pebbleLogger adapts zap to pebble's Logger.
type pebbleLogger struct{ l *zap.Logger }

// Infof logs pebble's routine chatter (flushes, compactions) at DEBUG.
func (p pebbleLogger) Infof(format string, args ...any) {
	p.l.Debug(strings.TrimSpace(fmt.Sprintf(format, args...)), zap.String("component", "pebble"))
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error(strings.TrimSpace(fmt.Sprintf(format, args...)), zap.String("component", "pebble"))
}

func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := strings.TrimSpace(fmt.Sprintf(format, args...))
	p.l.Error(msg, zap.String("component", "pebble"), zap.Bool("fatal", true))
	pf := &pebbleFatal{msg: msg}
	for _, a := range args {
		if err, ok := a.(error); ok {
			pf.cause = err
			break
		}
	}
	panic(pf)
}

// Jobs lists the jobs that have checkpoints in the store, sorted.
func (s *Store) Jobs(ctx context.Context) ([]string, error) {
	release, err := s.use(ctx)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	defer release()
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte("cp/"), UpperBound: []byte("cp0")})
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	var jobs []string
	for valid := it.First(); valid; {
		rest := it.Key()[len("cp/"):]
		i := bytes.IndexByte(rest, 0)
		if i < 0 {
			valid = it.Next()
			continue
		}
		job := string(rest[:i])
		jobs = append(jobs, job)
		_, hi := jobBounds(job)
		valid = it.SeekGE(hi)
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	return jobs, nil
}
