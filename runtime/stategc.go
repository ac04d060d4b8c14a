package runtime

// The job master's side of checkpoint storage (docs/internals/
// checkpoint-storage.md): it tracks which retained checkpoints reference
// which state objects (checkpoint.SharedRegistry, rebuilt from the retained
// checkpoints whenever an attempt starts), refuses to complete a checkpoint
// that reuses an object no retained checkpoint references any more, deletes
// the objects that retention or a failed checkpoint left unreferenced, and
// sweeps orphans (objects older than a grace period that nothing
// references) at every attempt's start, periodically, and when the job
// ends. It never reads the objects.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
)

// DefaultOrphanGrace is the default age below which an unreferenced object
// in checkpoint storage is left alone by the orphan sweep (OrphanGrace).
const DefaultOrphanGrace = 10 * time.Minute

// RetainedCheckpoints is implemented by checkpoint storages that can list a
// job's retained checkpoints (checkpoint.Store does): what the job master
// rebuilds its reference registry from. With checkpoint storage configured
// on a CheckpointStorage that does not implement it, nothing is ever
// deleted from checkpoint storage.
type RetainedCheckpoints interface {
	List(ctx context.Context, job string) ([]checkpoint.Summary, error)
	Get(ctx context.Context, job string, id checkpoint.ID) (checkpoint.Completed, error)
}

var _ RetainedCheckpoints = (*checkpoint.Store)(nil)

// FencedCheckpoints is implemented by checkpoint storages that another job
// master may take over while this one still runs (the job manager's
// high-availability store): RetainedIDs reads the ids of job's retained
// checkpoints in one step with the check that this job master still leads,
// and fails otherwise. Every deletion from checkpoint storage is decided on
// such a read, so a deposed job master (paused across its lease's expiry)
// deletes nothing a new leader's checkpoints use. A storage without it is
// the job master's alone (checkpoint.Store: its directory is locked), and
// List is that read.
//
// Such a storage may also apply a save whose outcome was unknown (etcd
// timed out, then applied it): the objects of a checkpoint whose save's
// outcome was unknown are not deleted as a failed checkpoint's; only the
// orphan sweep, past its grace period, deletes them if no retained
// checkpoint references them.
type FencedCheckpoints interface {
	RetainedIDs(ctx context.Context, job string) ([]checkpoint.ID, error)
}

// OrphanSweeper is implemented by checkpoint storages that keep objects of
// their own in checkpoint storage (the high-availability store's metadata
// objects): SweepOrphans deletes those of job modified before cutoff that
// no retained checkpoint names (decided on a fenced read), and returns how
// many it deleted. The orphan sweep calls it.
type OrphanSweeper interface {
	SweepOrphans(ctx context.Context, job string, cutoff time.Time) (int, error)
}

// stateGC is the job master's reference tracking and garbage collection.
type stateGC struct {
	st      storage.Storage
	job     string
	lister  RetainedCheckpoints // nil: nothing is deleted
	grace   time.Duration
	every   time.Duration // periodic sweep interval
	log     *zap.Logger
	reg     *checkpoint.SharedRegistry
	deleted func(n int)

	mu        sync.Mutex
	unknown   bool                                  // a retained checkpoint is unreadable or unknown: delete nothing
	inFlight  map[checkpoint.ID]map[string]struct{} // objects acked for checkpoints not (yet) completed
	doubtful  map[checkpoint.ID]bool                // checkpoints whose save's outcome was unknown
	lastSweep time.Time
}

func newStateGC(cfg clusterCfg, store CheckpointStorage) *stateGC {
	if cfg.stateStorage == nil {
		return nil
	}
	g := &stateGC{st: cfg.stateStorage, job: cfg.jobID, grace: cfg.orphanGrace, every: max(cfg.orphanGrace, cfg.timeout), log: cfg.log,
		reg: checkpoint.NewSharedRegistry(cfg.jobID), inFlight: map[checkpoint.ID]map[string]struct{}{}, doubtful: map[checkpoint.ID]bool{}, deleted: cfg.onStateDeleted}
	if l, ok := store.(RetainedCheckpoints); ok {
		g.lister = l
	} else {
		cfg.log.Warn("the checkpoint store cannot list retained checkpoints: objects in checkpoint storage are never deleted", zap.String("job", cfg.jobID))
	}
	return g
}

// rebuild registers every retained checkpoint's references afresh. Until
// one succeeds (and while a retained checkpoint is unreadable) nothing is
// deleted: what the retained checkpoints reference is not known.
func (g *stateGC) rebuild(ctx context.Context) error {
	if g == nil || g.lister == nil {
		return nil
	}
	reg, unknown, err := g.read(ctx)
	if err != nil {
		g.mu.Lock()
		g.unknown = true
		g.mu.Unlock()
		return err
	}
	if unknown {
		g.log.Warn("a retained checkpoint is unreadable: nothing is deleted from checkpoint storage until it is subsumed", zap.String("job", g.job))
	}
	g.mu.Lock()
	g.reg, g.unknown = reg, unknown
	// Checkpoints acknowledged in an earlier attempt that the store does
	// not hold never completed: their objects go. Not those of a
	// checkpoint whose save's outcome was unknown in a store that may
	// still apply it (FencedCheckpoints): the orphan sweep's grace period
	// decides those.
	_, late := g.lister.(FencedCheckpoints)
	var stale []string
	for id, m := range g.inFlight {
		if late && g.doubtful[id] {
			continue
		}
		for k := range m {
			if !reg.Live(k) {
				stale = append(stale, k)
			}
		}
	}
	clear(g.inFlight)
	clear(g.doubtful)
	g.mu.Unlock()
	if !unknown && len(stale) > 0 {
		if _, ok := g.fenced(ctx, reg, "failed checkpoint"); ok {
			g.delete(ctx, stale, "failed checkpoint")
		}
	}
	return nil
}

// fenced reads the ids of the retained checkpoints for a deletion (why):
// with the check that this job master still leads, where the store can be
// taken over (FencedCheckpoints). ok is false, and nothing may be deleted,
// when the read failed or names a checkpoint reg does not know: another
// job master wrote it, so this one is deposed or its view is stale; what
// the retained checkpoints reference is then unknown until rebuilt.
func (g *stateGC) fenced(ctx context.Context, reg *checkpoint.SharedRegistry, why string) ([]checkpoint.ID, bool) {
	var ids []checkpoint.ID
	if f, ok := g.lister.(FencedCheckpoints); ok {
		got, err := f.RetainedIDs(ctx, g.job)
		if err != nil {
			g.log.Warn("checkpoint storage: cannot confirm the retained checkpoints (is this job manager still the leader?); nothing deleted",
				zap.String("job", g.job), zap.String("reason", why), zap.Error(err))
			return nil, false
		}
		ids = got
	} else {
		sums, err := g.lister.List(ctx, g.job)
		if err != nil {
			g.log.Warn("checkpoint storage: cannot list retained checkpoints; nothing deleted", zap.String("job", g.job),
				zap.String("reason", why), zap.Error(err))
			return nil, false
		}
		for _, s := range sums {
			if s.Err != nil {
				g.markUnknown()
				return nil, false
			}
			ids = append(ids, s.ID)
		}
	}
	known := map[checkpoint.ID]bool{}
	for _, id := range reg.Checkpoints() {
		known[id] = true
	}
	for _, id := range ids {
		if !known[id] {
			g.log.Warn("checkpoint storage: the retained checkpoints include one this job master does not know (another job manager leads, or its view is stale); nothing deleted until it learns them again",
				zap.String("job", g.job), zap.String("reason", why), zap.Uint64("checkpoint", uint64(id)))
			g.markUnknown()
			return nil, false
		}
	}
	return ids, true
}

func (g *stateGC) markUnknown() {
	g.mu.Lock()
	g.unknown = true
	g.mu.Unlock()
}

// outcomeUnknown notes that the save of checkpoint id may or may not have
// landed.
func (g *stateGC) outcomeUnknown(id checkpoint.ID) {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.doubtful[id] = true
	g.mu.Unlock()
}

// ended is called once the job master stopped running the job (its last
// attempt's tasks and coordinator stopped): no checkpoint in flight will
// complete, so the objects tasks acknowledged for one go whatever their
// age (rebuild), then the orphan sweep runs. An object a task wrote and
// never acknowledged stays until it is older than the grace period and a
// later sweep of the same job sees it.
func (g *stateGC) ended(ctx context.Context) {
	if g == nil {
		return
	}
	if err := g.rebuild(ctx); err != nil {
		g.log.Warn("checkpoint storage: cannot rebuild the reference registry at the job's end; unreferenced objects stay", zap.String("job", g.job), zap.Error(err))
		return
	}
	g.sweep(ctx, g.grace)
}

// read registers the references of every retained checkpoint in a new
// registry; unknown reports a retained checkpoint it could not read.
func (g *stateGC) read(ctx context.Context) (reg *checkpoint.SharedRegistry, unknown bool, err error) {
	sums, err := g.lister.List(ctx, g.job)
	if err != nil {
		return nil, false, fmt.Errorf("checkpoint storage: list retained checkpoints: %w", err)
	}
	reg = checkpoint.NewSharedRegistry(g.job)
	for _, s := range sums {
		if s.Err != nil {
			unknown = true
			continue
		}
		c, err := g.lister.Get(ctx, g.job, s.ID)
		if err != nil {
			if errors.Is(err, checkpoint.ErrCorrupt) {
				unknown = true
				continue
			}
			return nil, false, fmt.Errorf("checkpoint storage: read retained checkpoint %d: %w", s.ID, err)
		}
		reg.Register(c)
	}
	return reg, unknown, nil
}

func (g *stateGC) registry() *checkpoint.SharedRegistry {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reg
}

// check refuses a checkpoint reusing an object that may be deleted.
func (g *stateGC) check(c checkpoint.Completed) error {
	if g == nil {
		return nil
	}
	return g.registry().Check(c)
}

// acked notes the objects a task's acknowledgement of id names that were
// written for id.
func (g *stateGC) acked(id checkpoint.ID, snap checkpoint.TaskSnapshot) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, r := range snap.Refs() {
		if r.Checkpoint != id {
			continue
		}
		m := g.inFlight[id]
		if m == nil {
			m = map[string]struct{}{}
			g.inFlight[id] = m
		}
		m[r.Key] = struct{}{}
	}
}

// saved registers a checkpoint just saved, and deletes the objects no
// retained checkpoint references any more. While what the retained
// checkpoints reference is unknown it deletes nothing, and tries to
// learn it again.
func (g *stateGC) saved(ctx context.Context, c checkpoint.Completed) {
	if g == nil {
		return
	}
	reg := g.registry()
	reg.Register(c)
	g.mu.Lock()
	for id := range g.inFlight {
		if id <= c.ID {
			delete(g.inFlight, id)
		}
	}
	unknown := g.unknown
	sweep := time.Since(g.lastSweep) >= g.every
	g.mu.Unlock()
	if g.lister == nil {
		return
	}
	if unknown {
		fresh, stillUnknown, err := g.read(ctx)
		if err != nil || stillUnknown {
			return
		}
		g.mu.Lock()
		g.reg, g.unknown = fresh, false
		g.mu.Unlock()
		reg = fresh
	}
	ids, ok := g.fenced(ctx, reg, "subsumed")
	if !ok {
		return
	}
	g.delete(ctx, reg.Retain(ids), "subsumed")
	if sweep {
		g.sweep(ctx, g.grace)
	}
}

// aborted deletes the objects written for a failed checkpoint.
func (g *stateGC) aborted(ctx context.Context, id checkpoint.ID) {
	if g == nil {
		return
	}
	g.mu.Lock()
	objs := g.inFlight[id]
	if _, late := g.lister.(FencedCheckpoints); late && g.doubtful[id] {
		// Its save may still land: the next attempt's registry, or the
		// orphan sweep after its grace period, decides.
		g.mu.Unlock()
		return
	}
	delete(g.inFlight, id)
	g.mu.Unlock()
	var keys []string
	reg := g.registry()
	for k := range objs {
		if !reg.Live(k) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 || g.lister == nil {
		return
	}
	ids, ok := g.fenced(ctx, reg, "failed checkpoint")
	if !ok || slices.Contains(ids, id) {
		return
	}
	g.delete(ctx, keys, "failed checkpoint")
}

// sweep deletes the objects below the job's shared prefix that no retained
// checkpoint references, that no checkpoint in flight was acknowledged
// with, and that are older than grace.
func (g *stateGC) sweep(ctx context.Context, grace time.Duration) {
	if g == nil || g.lister == nil {
		return
	}
	g.mu.Lock()
	g.lastSweep = time.Now()
	unknown := g.unknown
	inFlight := map[string]bool{}
	for _, m := range g.inFlight {
		for k := range m {
			inFlight[k] = true
		}
	}
	g.mu.Unlock()
	if unknown {
		return
	}
	reg := g.registry()
	// The cutoff is taken before the fenced read: an object a later leader
	// wrote is younger than the read, so younger than the cutoff.
	cutoff := time.Now().Add(-grace)
	if _, ok := g.fenced(ctx, reg, "orphan"); !ok {
		return
	}
	if s, ok := g.lister.(OrphanSweeper); ok {
		n, err := s.SweepOrphans(ctx, g.job, cutoff)
		if err != nil {
			g.log.Warn("checkpoint storage: orphan sweep of the checkpoint metadata failed", zap.String("job", g.job), zap.Error(err))
		}
		if n > 0 {
			g.log.Debug("checkpoint storage: objects deleted", zap.String("job", g.job), zap.String("reason", "orphan metadata"), zap.Int("objects", n))
			if g.deleted != nil {
				g.deleted(n)
			}
		}
	}
	var orphans []string
	err := g.st.List(ctx, checkpoint.SharedPrefix(g.job), func(o storage.Object) error {
		if !reg.Live(o.Key) && !inFlight[o.Key] && o.Modified.Before(cutoff) {
			orphans = append(orphans, o.Key)
		}
		return nil
	})
	if err != nil {
		g.log.Warn("checkpoint storage: orphan sweep could not list objects", zap.String("job", g.job), zap.Error(err))
		return
	}
	g.delete(ctx, orphans, "orphan")
}

func (g *stateGC) delete(ctx context.Context, keys []string, why string) {
	n := 0
	for _, k := range keys {
		if err := g.st.Delete(ctx, k); err != nil {
			g.log.Warn("checkpoint storage: delete failed; the orphan sweep retries", zap.String("object", k), zap.Error(err))
			continue
		}
		n++
	}
	if n > 0 {
		g.log.Debug("checkpoint storage: objects deleted", zap.String("job", g.job), zap.String("reason", why), zap.Int("objects", n))
		if g.deleted != nil {
			g.deleted(n)
		}
	}
}
