package runtime

// The task side of checkpoint storage (docs/internals/checkpoint-storage.md):
// a deployment with DeploySpec.Storage writes each task's snapshot to it
// (checkpoint.SegmentWriter) before acknowledging, with references instead
// of the bytes, and reads referenced state back itself on restore. Each task
// keeps the base its incremental checkpoints compare against: the key
// groups of the last checkpoint it was told completed, or of the
// checkpoint it restored; an aborted checkpoint resets it (the next
// checkpoint writes every key group), since the abort may be the job
// manager refusing a reference to an object it deleted.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
)

// stateWriter writes the snapshots of a deployment's tasks to checkpoint
// storage and keeps their incremental bases.
type stateWriter struct {
	w    *checkpoint.SegmentWriter
	log  *zap.Logger
	full bool // no incremental checkpoints

	mu      sync.Mutex
	base    map[checkpoint.TaskID]checkpoint.StateBase
	pending map[checkpoint.TaskID]map[checkpoint.ID]checkpoint.StateBase
	uploads sync.WaitGroup
}

func newStateWriter(spec DeploySpec, log *zap.Logger) *stateWriter {
	if spec.Storage == nil {
		return nil
	}
	return &stateWriter{w: checkpoint.NewSegmentWriter(spec.Storage, spec.JobID, spec.InlineLimit), log: log, full: spec.FullUploads,
		base: map[checkpoint.TaskID]checkpoint.StateBase{}, pending: map[checkpoint.TaskID]map[checkpoint.ID]checkpoint.StateBase{}}
}

// write writes snap and then acknowledges it (or declines the checkpoint
// if the write failed), in its own goroutine so the task goes on.
func (s *stateWriter) write(ctx context.Context, task checkpoint.TaskID, id checkpoint.ID, snap checkpoint.TaskSnapshot,
	ack func(checkpoint.TaskSnapshot), decline func(error)) {
	s.mu.Lock()
	base := s.base[task]
	s.mu.Unlock()
	if s.full {
		base = nil
	}
	s.uploads.Add(1)
	go func() {
		defer s.uploads.Done()
		start := time.Now()
		out, next, n, err := s.w.Write(ctx, id, snap, base)
		if err != nil {
			decline(fmt.Errorf("%w: %w", checkpoint.ErrDeclined, err))
			return
		}
		if n > 0 {
			s.log.Debug("task state written to checkpoint storage", zap.String("task", string(task)), zap.Uint64("checkpoint", uint64(id)),
				zap.Int64("bytes", n), zap.Int64("state_bytes", out.Size()), zap.Duration("took", time.Since(start)))
		}
		s.mu.Lock()
		p := s.pending[task]
		if p == nil {
			p = map[checkpoint.ID]checkpoint.StateBase{}
			s.pending[task] = p
		}
		p[id] = next
		s.mu.Unlock()
		ack(out)
	}()
}

// notify moves each task's base on a completed checkpoint to what that
// checkpoint wrote, and resets every base on an aborted one.
func (s *stateWriter) notify(id checkpoint.ID, complete bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for task, p := range s.pending {
		if complete {
			if b, ok := p[id]; ok {
				s.base[task] = b
			}
			for cid := range p {
				if cid <= id {
					delete(p, cid)
				}
			}
			continue
		}
		delete(p, id)
	}
	if !complete {
		clear(s.base)
	}
}

// seed sets a task's base to the state it restored.
func (s *stateWriter) seed(task checkpoint.TaskID, b checkpoint.StateBase) {
	if s == nil || b == nil {
		return
	}
	s.mu.Lock()
	s.base[task] = b
	s.mu.Unlock()
}

// wait waits for the uploads in flight.
func (s *stateWriter) wait() {
	if s != nil {
		s.uploads.Wait()
	}
}

// nativeBases are the bases of the local tasks whose pebble instances
// restore from native snapshots: the files each instance opens on are in
// checkpoint storage already (nativeRestoreBase).
func nativeBases(p *plan, restore *StateAssignment, local func(checkpoint.TaskID) bool) map[checkpoint.TaskID]checkpoint.StateBase {
	bases := map[checkpoint.TaskID]checkpoint.StateBase{}
	for _, v := range p.vertices {
		for sub := 0; sub < v.parallelism; sub++ {
			id := v.taskID(sub)
			if !local(id) {
				continue
			}
			lo, hi := KeyGroupSpan(sub, p.job.maxParallelism, v.parallelism)
			for _, n := range v.nodes {
				if r := restore.Subtasks[OperatorSubtask{n.uid, sub}]; r != nil && len(r.Native) > 0 {
					if b := nativeRestoreBase(n.uid, r.Native, lo, hi, bases[id]); b != nil {
						bases[id] = b
					}
				}
			}
		}
	}
	return bases
}

// resolveRestore reads the referenced state of the subtasks local runs
// from spec.Storage, and returns the assignment with that state inline and
// the base of each local task. Without references it returns restore as is,
// with the bases of the tasks restoring native snapshots (nativeBases).
func resolveRestore(ctx context.Context, p *plan, spec DeploySpec, local func(checkpoint.TaskID) bool) (*StateAssignment, map[checkpoint.TaskID]checkpoint.StateBase, error) {
	restore := spec.Restore
	var refs []checkpoint.StateRef
	for _, v := range p.vertices {
		for sub := 0; sub < v.parallelism; sub++ {
			if !local(v.taskID(sub)) {
				continue
			}
			for _, n := range v.nodes {
				if r := restore.Subtasks[OperatorSubtask{n.uid, sub}]; r != nil {
					refs = append(refs, r.EntryRefs...)
					for _, ref := range r.KeyGroupRefs {
						refs = append(refs, ref)
					}
				}
			}
		}
	}
	bases := nativeBases(p, restore, local)
	if len(refs) == 0 {
		return restore, bases, nil
	}
	if spec.Storage == nil {
		return nil, nil, fmt.Errorf("restore from checkpoint %d: its state is in checkpoint storage (e.g. %s), and this deployment has none configured",
			restore.From, refs[0].Key)
	}
	got, err := checkpoint.ReadRefs(ctx, spec.Storage, refs)
	if err != nil {
		return nil, nil, fmt.Errorf("restore from checkpoint %d: %w", restore.From, err)
	}
	out := *restore
	out.Subtasks = make(map[OperatorSubtask]*SubtaskState, len(restore.Subtasks))
	for k, v := range restore.Subtasks {
		out.Subtasks[k] = v
	}
	for _, v := range p.vertices {
		for sub := 0; sub < v.parallelism; sub++ {
			id := v.taskID(sub)
			if !local(id) {
				continue
			}
			for _, n := range v.nodes {
				k := OperatorSubtask{n.uid, sub}
				r := restore.Subtasks[k]
				if r == nil || (len(r.EntryRefs) == 0 && len(r.KeyGroupRefs) == 0) {
					continue
				}
				nr := *r
				nr.Entries = append([][]byte(nil), r.Entries...)
				for _, ref := range r.EntryRefs {
					nr.Entries = append(nr.Entries, got[ref])
				}
				nr.KeyGroups = make(map[int][]byte, len(r.KeyGroups)+len(r.KeyGroupRefs))
				for kg, b := range r.KeyGroups {
					nr.KeyGroups[kg] = b
				}
				for kg, ref := range r.KeyGroupRefs {
					nr.KeyGroups[kg] = got[ref]
				}
				nr.EntryRefs, nr.KeyGroupRefs = nil, nil
				out.Subtasks[k] = &nr
				bases[id] = checkpoint.BaseFrom(n.uid, r.KeyGroupRefs, func(kg int) []byte { return got[r.KeyGroupRefs[kg]] }, bases[id])
			}
		}
	}
	return &out, bases, nil
}
