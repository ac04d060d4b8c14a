package runtime

import (
	"context"
	"fmt"
	"slices"

	"github.com/weirstream/weir/checkpoint"
)

// RestoreVerifier is implemented by a Source or Sink whose state can be
// restored only if something outside the checkpoint agrees: a share group,
// for one, forgets the records it acknowledged, so state older than the
// group's latest committed acknowledgements cannot be restored. Before a
// job's first attempt restores a savepoint it starts from (StartFrom),
// and at submit (VerifyRestore), the runtime calls VerifyRestore once per
// such operator with the state of all its subtasks (an operator the
// checkpoint holds nothing of is not asked), on a fresh instance from its
// factory that is neither opened nor closed: it must reach what it checks
// by itself. A refusal fails the job without a restart: return an error
// wrapping ErrUnrecoverable (Unrecoverable) that says why and what to do.
// A job resumed by a job master, or restarted on its checkpoint directory,
// restores its own latest checkpoint and is not verified, nor are the
// restarts of a running job (failovers).
type RestoreVerifier interface {
	VerifyRestore(ctx context.Context, r RestoredOperator) error
}

// RestoredOperator is what one operator restores from a checkpoint, over
// all its subtasks.
type RestoredOperator struct {
	// Job is the id of the job restoring (not the one that took the
	// checkpoint, for a savepoint); UID is the operator's.
	Job, UID string
	// Checkpoint is the checkpoint restored.
	Checkpoint checkpoint.ID
	// Entries are the operator state entries of every subtask.
	Entries [][]byte
	// Handles are the operator's transactions the restore commits.
	Handles []checkpoint.TxnHandle
}

// VerifyRestore asks every RestoreVerifier operator of job whether it can
// restore c (with AllowNonRestoredState as given, as CheckRestore), as
// job's first attempt will ask it: a job manager calls it at submit, so
// that a job that would be refused is not created. jobID is the id the job
// will run under.
func VerifyRestore(ctx context.Context, job *Job, jobID string, c checkpoint.Completed, allowNonRestored bool) error {
	p, err := compile(job)
	if err != nil {
		return err
	}
	as, err := AssignState(p.layout(), RestoreInput{Checkpoint: c, AllowNonRestoredState: allowNonRestored})
	if err != nil {
		return err
	}
	return verifyRestore(ctx, p, jobID, as)
}

// verifyRestore runs the RestoreVerifier operators of p on the state as
// assigns them, one after the other; the first refusal is returned.
func verifyRestore(ctx context.Context, p *plan, jobID string, as *StateAssignment) error {
	if as.From == 0 {
		return nil
	}
	for _, n := range p.job.nodes {
		if n.newUser == nil {
			continue
		}
		r := RestoredOperator{Job: jobID, UID: n.uid, Checkpoint: as.From}
		for i := range n.parallelism {
			st := as.Subtasks[OperatorSubtask{n.uid, i}]
			if st == nil || st.From == 0 {
				continue
			}
			r.Entries = append(r.Entries, st.Entries...)
			if r.Handles == nil {
				r.Handles = slices.Clone(st.CommitHandles)
			}
		}
		if r.Entries == nil && r.Handles == nil {
			continue // the checkpoint holds nothing of the operator
		}
		v, ok := n.newUser().(RestoreVerifier)
		if !ok {
			continue
		}
		if err := callVerifyRestore(ctx, v, r); err != nil {
			return fmt.Errorf("operator %q cannot restore checkpoint %d: %w", n.uid, as.From, err)
		}
	}
	return nil
}

// callVerifyRestore runs v's VerifyRestore, a panic turned into an error.
func callVerifyRestore(ctx context.Context, v RestoreVerifier, r RestoredOperator) (err error) {
	defer recoverInto(&err)
	return v.VerifyRestore(ctx, r)
}
