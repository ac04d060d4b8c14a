package jobmanager

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/jobmanager/ha"
	"github.com/weirstream/weir/runtime"
)

// The stores a job manager keeps its jobs and completed checkpoints in:
// pebble under --data-dir (standalone, the default), or etcd and object
// storage (high availability). The job manager uses them only through
// these two interfaces.

// jobStore keeps job records.
type jobStore interface {
	// Put writes r durably.
	Put(r JobRecord) error
	// Get reads the record of job id (ErrJobNotFound if none).
	Get(id string) (JobRecord, error)
	// List returns every job record, by id.
	List() ([]JobRecord, error)
	Close() error
}

// checkpointStore keeps completed checkpoints: the runtime's checkpoint
// storage plus what the client API lists.
type checkpointStore interface {
	runtime.CheckpointStorage
	// Latest returns the newest completed checkpoint of job.
	Latest(ctx context.Context, job string) (checkpoint.Completed, error)
	// List summarises the completed checkpoints of job, newest first.
	List(ctx context.Context, job string) ([]checkpoint.Summary, error)
	// DeleteJob deletes every completed checkpoint of job (a cancelled
	// job's, Flink's discard on cancel); ids are not handed out again.
	DeleteJob(ctx context.Context, job string) error
	Close() error
}

var (
	_ jobStore        = (*JobStore)(nil)
	_ checkpointStore = (*checkpoint.Store)(nil)
	_ jobStore        = (*haJobStore)(nil)
	_ checkpointStore = (*haCheckpointStore)(nil)
)

// haTimeout bounds one etcd or object-storage call of the HA stores made
// without a context of the caller's.
const haTimeout = 10 * time.Second

// haRetained is how many completed checkpoints per job the HA checkpoint
// store keeps, as the pebble store does by default.
const haRetained = 3

// etcd keys of the HA stores, under the cluster's data namespace
// (ha.Services): pointers and small records, never state.
const (
	haJobPrefix     = "jobs/"        // jobs/<id>: the job record (JSON)
	haCounterPrefix = "counters/"    // counters/<job>: highest checkpoint id handed out (decimal)
	haPointerPrefix = "checkpoints/" // checkpoints/<job>/<id, 20 digits>: pointer (JSON) to the metadata object
)

// bound bounds a call of the HA stores made for leadership l: by
// haTimeout, and by the leadership (a leader that lost it stops waiting
// on etcd or the storage at once).
func bound(ctx context.Context, l *ha.Leadership) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeoutCause(ctx, haTimeout, fmt.Errorf("no answer within %v", haTimeout))
	stop := context.AfterFunc(l.Context(), cancel)
	return ctx, func() { stop(); cancel() }
}

// fenced makes err, of a call made for leadership l, say ErrNotLeader when
// the call failed because l ended (its context was cancelled under it).
func fenced(l *ha.Leadership, err error) error {
	if err == nil || errors.Is(err, ha.ErrNotLeader) {
		return err
	}
	if cause := context.Cause(l.Context()); cause != nil {
		return fmt.Errorf("%w (%w)", cause, err)
	}
	return err
}

// haJobStore keeps job records in etcd, written under the leadership.
type haJobStore struct {
	svc    *ha.Services
	leader *ha.Leadership
}

func newHAJobStore(svc *ha.Services, l *ha.Leadership) *haJobStore {
	return &haJobStore{svc: svc, leader: l}
}

func (s *haJobStore) Put(r JobRecord) (err error) {
	defer func() { err = fenced(s.leader, err) }()
	if r.ID == "" {
		return errors.New("job record without an id")
	}
	v, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode job %s: %w", r.ID, err)
	}
	ctx, cancel := bound(context.Background(), s.leader)
	defer cancel()
	if err := s.leader.Put(ctx, haJobPrefix+r.ID, v); err != nil {
		return fmt.Errorf("store job %s: %w", r.ID, err)
	}
	return nil
}

func (s *haJobStore) Get(id string) (_ JobRecord, err error) {
	defer func() { err = fenced(s.leader, err) }()
	ctx, cancel := bound(context.Background(), s.leader)
	defer cancel()
	v, ok, err := s.svc.Get(ctx, haJobPrefix+id)
	if err != nil {
		return JobRecord{}, fmt.Errorf("read job %s: %w", id, err)
	}
	if !ok {
		return JobRecord{}, fmt.Errorf("%w: %s", ErrJobNotFound, id)
	}
	var r JobRecord
	if err := json.Unmarshal(v, &r); err != nil {
		return JobRecord{}, fmt.Errorf("decode job %s: %w", id, err)
	}
	return r, nil
}

func (s *haJobStore) List() (_ []JobRecord, err error) {
	defer func() { err = fenced(s.leader, err) }()
	ctx, cancel := bound(context.Background(), s.leader)
	defer cancel()
	var out []JobRecord
	err = s.svc.List(ctx, haJobPrefix, func(key string, v []byte) error {
		var r JobRecord
		if err := json.Unmarshal(v, &r); err != nil {
			return fmt.Errorf("decode job %s: %w", key, err)
		}
		out = append(out, r)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	return out, nil // etcd lists by key: by id
}

func (s *haJobStore) Close() error { return nil }

// haCheckpointStore keeps completed checkpoints for a highly available job
// manager: each checkpoint's metadata (the checkpoint package's record
// encoding) as the object <job>/chk-<id>/_metadata in the shared checkpoint
// storage, written with Create, and a pointer to it in etcd, created under
// the leadership: the pointer is the commit point. The checkpoint id
// counter is in etcd too.
type haCheckpointStore struct {
	svc      *ha.Services
	leader   *ha.Leadership
	objects  storage.Storage
	retained int

	mu sync.Mutex // one NextID or Save at a time

	// cache holds the metadata objects read for List and Get, by key: an
	// object never changes once a pointer names it, so status, list and
	// the REST API read etcd and decode nothing again. Entries whose
	// pointer is gone are dropped at the next read of their job.
	cacheMu sync.Mutex
	cache   map[string][]byte
	sums    map[string]checkpoint.Summary // decoded summaries, by metadata key
}

func newHACheckpointStore(svc *ha.Services, l *ha.Leadership, objects storage.Storage) *haCheckpointStore {
	return &haCheckpointStore{svc: svc, leader: l, objects: objects, retained: haRetained,
		cache: map[string][]byte{}, sums: map[string]checkpoint.Summary{}}
}

// haPointer is what etcd holds of a completed checkpoint.
type haPointer struct {
	// Metadata is the key of the checkpoint's metadata object in the
	// checkpoint storage, Size its length.
	Metadata string `json:"metadata"`
	Size     int64  `json:"size"`
}

func metadataKey(job string, id checkpoint.ID) string {
	return fmt.Sprintf("%s/chk-%d/_metadata", job, id)
}

func pointerPrefix(job string) string { return haPointerPrefix + job + "/" }

func pointerKey(job string, id checkpoint.ID) string {
	return fmt.Sprintf("%s%020d", pointerPrefix(job), uint64(id))
}

// checkHAJob refuses a job name that cannot name etcd keys and objects.
func checkHAJob(job string) error {
	if job == "" || strings.ContainsAny(job, "/\x00") || strings.HasPrefix(job, ".") {
		return fmt.Errorf("job name %q: not empty, no slash or NUL, not starting with a dot", job)
	}
	return nil
}

// pointers returns job's checkpoint pointers, oldest first.
func (s *haCheckpointStore) pointers(ctx context.Context, job string) ([]checkpoint.ID, []haPointer, error) {
	return s.listPointers(ctx, job, s.svc.List)
}

// fencedPointers returns job's checkpoint pointers, oldest first, read in
// one step with the check that this job manager still leads: what every
// deletion decides on.
func (s *haCheckpointStore) fencedPointers(ctx context.Context, job string) ([]checkpoint.ID, []haPointer, error) {
	return s.listPointers(ctx, job, s.leader.List)
}

func (s *haCheckpointStore) listPointers(ctx context.Context, job string, list func(context.Context, string, func(string, []byte) error) error) ([]checkpoint.ID, []haPointer, error) {
	var ids []checkpoint.ID
	var ps []haPointer
	prefix := pointerPrefix(job)
	err := list(ctx, prefix, func(key string, v []byte) error {
		n, err := strconv.ParseUint(strings.TrimPrefix(key, prefix), 10, 64)
		if err != nil {
			return nil // not a pointer
		}
		var p haPointer
		if err := json.Unmarshal(v, &p); err != nil {
			p = haPointer{} // read as a checkpoint whose metadata is missing
		}
		ids, ps = append(ids, checkpoint.ID(n)), append(ps, p)
		return nil
	})
	return ids, ps, err
}

// NextID implements checkpoint.IDSource: the counter in etcd is advanced
// (under the leadership) before the id is returned, above every id handed
// out and every checkpoint saved.
func (s *haCheckpointStore) NextID(ctx context.Context, job string) (_ checkpoint.ID, err error) {
	defer func() { err = fenced(s.leader, err) }()
	ctx, cancel := bound(ctx, s.leader)
	defer cancel()
	if err := checkHAJob(job); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var next uint64
	v, ok, err := s.svc.Get(ctx, haCounterPrefix+job)
	if err != nil {
		return 0, fmt.Errorf("checkpoint id of job %q: %w", job, err)
	}
	if ok {
		if next, err = strconv.ParseUint(string(v), 10, 64); err != nil {
			return 0, fmt.Errorf("checkpoint id of job %q: counter %q: %w", job, v, err)
		}
	}
	ids, _, err := s.pointers(ctx, job)
	if err != nil {
		return 0, fmt.Errorf("checkpoint id of job %q: %w", job, err)
	}
	if n := len(ids); n > 0 && uint64(ids[n-1]) > next {
		next = uint64(ids[n-1])
	}
	next++
	if err := s.leader.Put(ctx, haCounterPrefix+job, []byte(strconv.FormatUint(next, 10))); err != nil {
		return 0, fmt.Errorf("checkpoint id of job %q: %w", job, err)
	}
	return checkpoint.ID(next), nil
}

// Save implements checkpoint.Persister: the metadata object first
// (Create), then the pointer in etcd (a fenced Create): the commit point.
// Then the pointers beyond the retained number are deleted, and their
// metadata objects after them. A failed pointer write whose outcome is
// unknown (etcd did not answer) wraps checkpoint.ErrOutcomeUnknown; any
// other error means the checkpoint was not committed.
func (s *haCheckpointStore) Save(ctx context.Context, c checkpoint.Completed) (err error) {
	defer func() { err = fenced(s.leader, err) }()
	ctx, cancel := bound(ctx, s.leader)
	defer cancel()
	if err := checkHAJob(c.Job); err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	b, err := checkpoint.EncodeCompleted(c)
	if err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ids, ps, err := s.pointers(ctx, c.Job)
	if err != nil {
		return fmt.Errorf("save checkpoint %d of job %q: %w", c.ID, c.Job, err)
	}
	if n := len(ids); n > 0 && c.ID <= ids[n-1] {
		return fmt.Errorf("save checkpoint %d of job %q: %w: latest saved is %d", c.ID, c.Job, checkpoint.ErrIDNotIncreasing, ids[n-1])
	}
	key := metadataKey(c.Job, c.ID)
	if err := s.objects.Create(ctx, key, bytes.NewReader(b)); err != nil {
		if !errors.Is(err, storage.ErrExists) {
			return fmt.Errorf("save checkpoint %d of job %q: metadata %s: %w", c.ID, c.Job, key, err)
		}
		// A retry of this Save: the object must be this checkpoint.
		if got, rerr := s.read(ctx, key); rerr != nil || !bytes.Equal(got, b) {
			return fmt.Errorf("save checkpoint %d of job %q: metadata %s exists and differs: %w", c.ID, c.Job, key, err)
		}
	}
	p, _ := json.Marshal(haPointer{Metadata: key, Size: int64(len(b))})
	if err := s.leader.Create(ctx, pointerKey(c.Job, c.ID), p); err != nil {
		switch {
		case errors.Is(err, ha.ErrNotLeader):
			// Not committed, and never will be: the object is an orphan.
			_ = s.objects.Delete(context.WithoutCancel(ctx), key)
			return fmt.Errorf("save checkpoint %d of job %q: %w", c.ID, c.Job, err)
		case errors.Is(err, ha.ErrExists):
			return fmt.Errorf("save checkpoint %d of job %q: %w: pointer exists", c.ID, c.Job, checkpoint.ErrIDNotIncreasing)
		}
		return fmt.Errorf("save checkpoint %d of job %q: %w: %w", c.ID, c.Job, checkpoint.ErrOutcomeUnknown, err)
	}
	ids, ps = append(ids, c.ID), append(ps, haPointer{Metadata: key})
	if drop := len(ids) - s.retained; drop > 0 {
		for i := range drop {
			if err := s.leader.Delete(ctx, pointerKey(c.Job, ids[i])); err != nil {
				break // kept; a later Save drops it
			}
			if ps[i].Metadata != "" {
				_ = s.objects.Delete(ctx, ps[i].Metadata)
			}
		}
	}
	return nil
}

func (s *haCheckpointStore) read(ctx context.Context, key string) ([]byte, error) {
	rc, err := s.objects.Open(ctx, key, 0, -1)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// scan calls fn with each checkpoint of job, newest first, and its
// metadata (nil, with the error, if it cannot be read), until fn returns
// false or an error.
//
// With cached, a metadata object read before is not read again (its
// pointer still names it, so it has not changed); without, every object is
// read afresh (a restore must see the storage as it is).
func (s *haCheckpointStore) scan(ctx context.Context, job string, cached bool, fn func(id checkpoint.ID, b []byte, err error) (bool, error)) (err error) {
	defer func() { err = fenced(s.leader, err) }()
	ctx, cancel := bound(ctx, s.leader)
	defer cancel()
	if err := checkHAJob(job); err != nil {
		return err
	}
	ids, ps, err := s.pointers(ctx, job)
	if err != nil {
		return err
	}
	s.pruneCache(job, ps)
	for i := len(ids) - 1; i >= 0; i-- {
		var b []byte
		var rerr error
		if ps[i].Metadata == "" {
			rerr = errors.New("pointer unreadable")
		} else if b, rerr = s.readCached(ctx, ps[i].Metadata, cached); errors.Is(rerr, storage.ErrNotFound) {
			rerr = fmt.Errorf("metadata %s missing: %w", ps[i].Metadata, rerr)
		} else if rerr != nil {
			return rerr // storage unreachable: not a verdict on the checkpoint
		}
		if rerr != nil {
			rerr = &checkpoint.CorruptError{Job: job, ID: ids[i], Record: "meta", Err: rerr}
			b = nil
		}
		more, err := fn(ids[i], b, rerr)
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// readCached reads the metadata object key, from the cache if cached and
// it is there; an object read whole is cached.
func (s *haCheckpointStore) readCached(ctx context.Context, key string, cached bool) ([]byte, error) {
	if cached {
		s.cacheMu.Lock()
		b, ok := s.cache[key]
		s.cacheMu.Unlock()
		if ok {
			return b, nil
		}
	}
	b, err := s.read(ctx, key)
	if err == nil {
		s.cacheMu.Lock()
		s.cache[key] = b
		s.cacheMu.Unlock()
	}
	return b, err
}

// pruneCache drops the cached metadata of job that no pointer in ps names.
func (s *haCheckpointStore) pruneCache(job string, ps []haPointer) {
	named := make(map[string]bool, len(ps))
	for _, p := range ps {
		named[p.Metadata] = true
	}
	s.cacheMu.Lock()
	defer s.cacheMu.Unlock()
	for k := range s.cache {
		if strings.HasPrefix(k, job+"/") && !named[k] {
			delete(s.cache, k)
		}
	}
	for k := range s.sums {
		if strings.HasPrefix(k, job+"/") && !named[k] {
			delete(s.sums, k)
		}
	}
}

// cachedObjects is the number of metadata objects in the cache.
func (s *haCheckpointStore) cachedObjects() int {
	s.cacheMu.Lock()
	defer s.cacheMu.Unlock()
	return len(s.cache)
}

func (s *haCheckpointStore) Latest(ctx context.Context, job string) (checkpoint.Completed, error) {
	c, err := s.decode(ctx, job, 0)
	if err != nil {
		return checkpoint.Completed{}, fmt.Errorf("latest checkpoint of job %q: %w", job, err)
	}
	return c, nil
}

// decode reads and decodes checkpoint id of job, the newest for id 0
// (read afresh; a given id from the cache).
func (s *haCheckpointStore) decode(ctx context.Context, job string, id checkpoint.ID) (checkpoint.Completed, error) {
	var c checkpoint.Completed
	found := false
	err := s.scan(ctx, job, id != 0, func(got checkpoint.ID, b []byte, err error) (bool, error) {
		if id != 0 && got != id {
			return got > id, nil
		}
		found = true
		if err != nil {
			return false, err
		}
		c, err = checkpoint.DecodeCompleted(job, got, b)
		return false, err
	})
	if err == nil && !found {
		err = checkpoint.ErrNotFound
	}
	return c, err
}

func (s *haCheckpointStore) LatestUsable(ctx context.Context, job string) (checkpoint.Completed, []checkpoint.Skipped, error) {
	var c checkpoint.Completed
	var skipped []checkpoint.Skipped
	found := false
	err := s.scan(ctx, job, false, func(id checkpoint.ID, b []byte, err error) (bool, error) {
		if err == nil {
			if c, err = checkpoint.DecodeCompleted(job, id, b); err == nil {
				found = true
				return false, nil
			}
		}
		skipped = append(skipped, checkpoint.SkippedOf(job, id, b, err))
		return true, nil
	})
	switch {
	case err != nil:
		return checkpoint.Completed{}, skipped, fmt.Errorf("latest usable checkpoint of job %q: %w", job, err)
	case !found && len(skipped) > 0:
		return checkpoint.Completed{}, skipped, fmt.Errorf("latest usable checkpoint of job %q: %w: all %d stored checkpoints are %w",
			job, checkpoint.ErrNotFound, len(skipped), checkpoint.ErrCorrupt)
	case !found:
		return checkpoint.Completed{}, nil, fmt.Errorf("latest usable checkpoint of job %q: %w", job, checkpoint.ErrNotFound)
	}
	return c, skipped, nil
}

func (s *haCheckpointStore) List(ctx context.Context, job string) ([]checkpoint.Summary, error) {
	var out []checkpoint.Summary
	err := s.scan(ctx, job, true, func(id checkpoint.ID, b []byte, err error) (bool, error) {
		sum := checkpoint.Summary{ID: id, Err: err}
		if err == nil {
			key := metadataKey(job, id)
			s.cacheMu.Lock()
			got, ok := s.sums[key]
			s.cacheMu.Unlock()
			switch {
			case ok:
				sum = got
			default:
				if sum, err = checkpoint.DecodeSummary(job, id, b); err != nil {
					sum = checkpoint.Summary{ID: id, Err: err}
					break
				}
				s.cacheMu.Lock()
				s.sums[key] = sum
				s.cacheMu.Unlock()
			}
		}
		out = append(out, sum)
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list checkpoints of job %q: %w", job, err)
	}
	return slices.Clip(out), nil
}

var _ runtime.RetainedCheckpoints = (*haCheckpointStore)(nil)

// Get returns checkpoint id of job (runtime.RetainedCheckpoints: the
// job master's state GC reads the retained checkpoints' references).
func (s *haCheckpointStore) Get(ctx context.Context, job string, id checkpoint.ID) (checkpoint.Completed, error) {
	c, err := s.decode(ctx, job, id)
	if err != nil {
		return checkpoint.Completed{}, fmt.Errorf("checkpoint %d of job %q: %w", id, job, err)
	}
	return c, nil
}

var (
	_ runtime.FencedCheckpoints = (*haCheckpointStore)(nil)
	_ runtime.OrphanSweeper     = (*haCheckpointStore)(nil)
)

// RetainedIDs implements runtime.FencedCheckpoints: the ids of job's
// retained checkpoints, read with the check that this job manager still
// leads, in one etcd transaction. A deposed leader gets ErrNotLeader, so
// its state GC deletes nothing.
func (s *haCheckpointStore) RetainedIDs(ctx context.Context, job string) (_ []checkpoint.ID, err error) {
	defer func() { err = fenced(s.leader, err) }()
	ctx, cancel := bound(ctx, s.leader)
	defer cancel()
	if err := checkHAJob(job); err != nil {
		return nil, err
	}
	ids, _, err := s.fencedPointers(ctx, job)
	if err != nil {
		return nil, fmt.Errorf("retained checkpoints of job %q: %w", job, err)
	}
	return ids, nil
}

// SweepOrphans implements runtime.OrphanSweeper: it deletes the metadata
// objects of job (<job>/chk-<id>/_metadata) modified before cutoff that no
// pointer names, as the fenced read of the pointers (after the objects
// were listed) says: those of checkpoints whose pointer write failed or
// was never made (the job manager died between the two). An object whose
// pointer write's outcome was unknown is kept until cutoff passes it.
func (s *haCheckpointStore) SweepOrphans(ctx context.Context, job string, cutoff time.Time) (_ int, err error) {
	defer func() { err = fenced(s.leader, err) }()
	ctx, cancel := bound(ctx, s.leader)
	defer cancel()
	if err := checkHAJob(job); err != nil {
		return 0, err
	}
	var old []string
	if err := s.objects.List(ctx, job+"/chk-", func(o storage.Object) error {
		if strings.HasSuffix(o.Key, "/_metadata") && o.Modified.Before(cutoff) {
			old = append(old, o.Key)
		}
		return nil
	}); err != nil {
		return 0, fmt.Errorf("sweep checkpoint metadata of job %q: %w", job, err)
	}
	if len(old) == 0 {
		return 0, nil
	}
	// The pointers are read after the listing: a pointer created since
	// names an object listed, and keeps it.
	_, ps, err := s.fencedPointers(ctx, job)
	if err != nil {
		return 0, fmt.Errorf("sweep checkpoint metadata of job %q: %w", job, err)
	}
	named := make(map[string]bool, len(ps))
	for _, p := range ps {
		named[p.Metadata] = true
	}
	n := 0
	for _, k := range old {
		if named[k] {
			continue
		}
		if err := s.objects.Delete(ctx, k); err != nil {
			return n, fmt.Errorf("sweep checkpoint metadata of job %q: %w", job, err)
		}
		n++
	}
	return n, nil
}

// DeleteJob deletes every checkpoint of job: its pointers, in one fenced
// etcd transaction (a deposed leader deletes nothing), then their metadata
// objects. The id counter stays, so ids never repeat. The job's state
// objects are the caller's to delete.
func (s *haCheckpointStore) DeleteJob(ctx context.Context, job string) (err error) {
	defer func() { err = fenced(s.leader, err) }()
	ctx, cancel := bound(ctx, s.leader)
	defer cancel()
	if err := checkHAJob(job); err != nil {
		return fmt.Errorf("delete checkpoints: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.leader.DeletePrefix(ctx, pointerPrefix(job)); err != nil {
		return fmt.Errorf("delete checkpoints of job %q: %w", job, err)
	}
	s.pruneCache(job, nil)
	var keys []string
	if err := s.objects.List(ctx, job+"/chk-", func(o storage.Object) error {
		if strings.HasSuffix(o.Key, "/_metadata") {
			keys = append(keys, o.Key)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("delete checkpoints of job %q: %w", job, err)
	}
	for _, k := range keys {
		if err := s.objects.Delete(ctx, k); err != nil && !errors.Is(err, storage.ErrNotFound) {
			return fmt.Errorf("delete checkpoints of job %q: %w", job, err)
		}
	}
	return nil
}

// Reopen implements runtime.CheckpointStorage: etcd and the object storage
// hold no state here to repair; the next read decides.
func (s *haCheckpointStore) Reopen() error { return nil }

// Close closes nothing: the caller owns the etcd connection and storage.
func (s *haCheckpointStore) Close() error { return nil }
