package runtime

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/weirstream/weir/checkpoint"
)

// This file is the restore assignment (Flink's StateAssignmentOperation): it
// decides, from a completed checkpoint, the newer checkpoints skipped as
// corrupt and the job graph being started, what every operator subtask
// restores and which transactions it must commit or abort. It is a pure
// function of its inputs and knows nothing of how tasks run, so the mini
// cluster and a job manager run the same rules.

// ErrIncompatibleState is wrapped by errors about a checkpoint the job graph
// cannot restore from: keyed state split into another number of key groups
// (max parallelism), state of operators no longer in the job, or state an
// operator cannot redistribute. A restart cannot fix it: the job fails.
var ErrIncompatibleState = errors.New("checkpoint incompatible with the job")

// OperatorSubtask names one parallel instance of an operator.
type OperatorSubtask struct {
	UID     string
	Subtask int
}

// OperatorLayout describes one operator of the job graph being restored.
type OperatorLayout struct {
	UID         string
	Parallelism int
	// MaxParallelism is the number of key groups of a keyed operator, 0 for
	// an operator without keyed state.
	MaxParallelism int
	// Union: the operator's state is union list state (UnionState): every
	// subtask restores every entry.
	Union bool
	// BroadcastState says that the operator state is broadcast state
	// (ProcessBroadcast): every subtask holds the same entries, so each
	// subtask restores the entries of one subtask of the checkpoint
	// (subtask i those of subtask i modulo the checkpoint's parallelism)
	// instead of a share of all of them.
	BroadcastState bool
}

// SubtaskState is the part of a checkpoint assigned to one operator subtask.
type SubtaskState struct {
	// From is the checkpoint restored (0: none).
	From checkpoint.ID
	// Entries are the operator state entries of this subtask.
	Entries [][]byte
	// KeyGroups are the key groups of the operator's keyed state that the
	// subtask owns (KeyGroupRange).
	KeyGroups map[int][]byte
	// EntryRefs and KeyGroupRefs are operator state entries and key groups
	// in checkpoint storage: the deployment reads them (and then holds
	// them in Entries and KeyGroups) before the subtask opens.
	EntryRefs    []checkpoint.StateRef       `json:",omitempty"`
	KeyGroupRefs map[int]checkpoint.StateRef `json:",omitempty"`
	// Native are the native snapshots (of the pebble backend) whose key
	// groups overlap the subtask's: it restores the key groups it owns
	// from their files.
	Native []*checkpoint.NativeState `json:",omitempty"`
	// CommitHandles are the transactions the operator (any of its subtasks)
	// pre-committed for the restored checkpoint and for newer checkpoints
	// skipped as corrupt: all of them completed, so all must be committed.
	CommitHandles []checkpoint.TxnHandle
	// AbortHandles are transactions of this subtask from acknowledged
	// checkpoints that never completed.
	AbortHandles []checkpoint.TxnHandle
	// Watermark is where a source subtask's watermark resumes: the least
	// its operator's subtasks had sent at the barrier, whatever the
	// parallelism then (nil: none, or one of them had sent none).
	Watermark *int64 `json:",omitempty"`
}

// RestoreInput is what AssignState restores from.
type RestoreInput struct {
	// Checkpoint is the checkpoint restored; ID 0 means none.
	Checkpoint checkpoint.Completed
	// Skipped are newer completed checkpoints passed over as corrupt
	// (checkpoint.Store.LatestUsable): their transactions are committed.
	Skipped []checkpoint.Skipped
	// Abort holds, per subtask, handles of acknowledged checkpoints newer
	// than Checkpoint that never completed.
	Abort map[OperatorSubtask][]checkpoint.TxnHandle
	// AllowNonRestoredState lets a job start although the checkpoint holds
	// state of operators (UIDs) it no longer has; that state is dropped,
	// and their pre-committed transactions are still committed (Orphans).
	AllowNonRestoredState bool
}

// StateAssignment is AssignState's answer.
type StateAssignment struct {
	From     checkpoint.ID
	Subtasks map[OperatorSubtask]*SubtaskState
	// Orphans are completed transactions of operators no longer in the job
	// (only with AllowNonRestoredState), and of skipped checkpoints whose
	// store format did not record their operator: they must be committed
	// before any subtask opens, by whichever operator can (see
	// RestoreCommitter).
	Orphans []checkpoint.TxnHandle
	// NonRestored are the UIDs whose state was dropped, sorted.
	NonRestored []string
}

// handleCount counts the distinct transactions the restore commits.
func (a *StateAssignment) handleCount() int {
	seen := map[string]bool{}
	add := func(hs []checkpoint.TxnHandle) {
		for _, h := range hs {
			seen[h.TransactionalID+"/"+strconv.FormatInt(h.ProducerID, 10)+"/"+strconv.Itoa(int(h.Epoch))] = true
		}
	}
	for _, st := range a.Subtasks {
		add(st.CommitHandles)
	}
	add(a.Orphans)
	return len(seen)
}

// AssignState applies the restore rules:
//
//   - State is matched to operators by UID. An operator whose UID the
//     checkpoint does not hold (one added to the job) starts fresh: its
//     subtasks get From 0, as a job started without a checkpoint.
//   - Keyed state restores only into the number of key groups it was split
//     into: a keyed operator whose max parallelism differs from the
//     checkpoint's is refused (ErrIncompatibleState).
//   - State of UIDs the job no longer has is refused, naming them, unless
//     AllowNonRestoredState; then it is dropped, and its transactions are
//     committed all the same.
//   - At the parallelism of the checkpoint, subtask i gets the operator
//     state entries of subtask i; at another parallelism, the entries of all
//     subtasks are dealt round-robin (so operator state must be a list of
//     independent entries). An operator with union state (UnionState) gets
//     every entry in every subtask; broadcast state
//     (OperatorLayout.BroadcastState) gets the entries of one subtask in
//     every subtask. Keyed state moves by key group.
//   - Every subtask of an operator gets every completed transaction of the
//     operator (the restored checkpoint's and the skipped ones'), so that
//     whichever subtask fences or reuses transactional ids first has
//     committed them all.
func AssignState(ops []OperatorLayout, in RestoreInput) (*StateAssignment, error) {
	c := in.Checkpoint
	out := &StateAssignment{From: c.ID, Subtasks: map[OperatorSubtask]*SubtaskState{}}
	inJob := map[string]OperatorLayout{}
	for _, op := range ops {
		inJob[op.UID] = op
	}

	byUID := map[string][]checkpoint.OperatorSnapshot{}
	for _, t := range c.Tasks {
		for _, op := range t.Operators {
			byUID[op.UID] = append(byUID[op.UID], op)
		}
	}
	// Completed transactions of the skipped checkpoints, by owner.
	skippedHandles := map[string][]checkpoint.TxnHandle{}
	for _, s := range in.Skipped {
		if !s.HandlesOK {
			continue
		}
		for _, o := range s.Owners {
			if o.UID == "" { // written by a format that did not record the owner
				out.Orphans = append(out.Orphans, o.Handles...)
				continue
			}
			skippedHandles[o.UID] = append(skippedHandles[o.UID], o.Handles...)
		}
	}

	// State of operators no longer in the job.
	missing := map[string]bool{}
	for uid, snaps := range byUID {
		if _, ok := inJob[uid]; ok {
			continue
		}
		for _, s := range snaps {
			if len(s.State) > 0 || len(s.KeyGroups) > 0 || len(s.Handles) > 0 || len(s.StateRefs) > 0 || len(s.KeyGroupRefs) > 0 || s.Native != nil {
				missing[uid] = true
			}
		}
	}
	for uid, hs := range skippedHandles {
		if _, ok := inJob[uid]; !ok && len(hs) > 0 {
			missing[uid] = true
		}
	}
	for uid := range missing {
		out.NonRestored = append(out.NonRestored, uid)
	}
	sort.Strings(out.NonRestored)
	if len(out.NonRestored) > 0 {
		if !in.AllowNonRestoredState {
			return nil, fmt.Errorf("%w: checkpoint %d holds state of operators the job no longer has (uids %s); restore the operators under these UIDs, or allow non-restored state to drop it (their pre-committed transactions are still committed)",
				ErrIncompatibleState, c.ID, strings.Join(out.NonRestored, ", "))
		}
		for _, uid := range out.NonRestored {
			for _, s := range byUID[uid] {
				out.Orphans = append(out.Orphans, s.Handles...)
			}
			out.Orphans = append(out.Orphans, skippedHandles[uid]...)
		}
	}

	for _, op := range ops {
		snaps := slices.Clone(byUID[op.UID])
		sort.Slice(snaps, func(i, j int) bool { return snaps[i].Subtask < snaps[j].Subtask })
		kgs := map[int][]byte{}
		kgRefs := map[int]checkpoint.StateRef{}
		for _, s := range snaps {
			if err := checkKeyGroups(c.ID, op, s); err != nil {
				return nil, err
			}
			for kg, b := range s.KeyGroups {
				kgs[kg] = b
			}
			for kg, r := range s.KeyGroupRefs {
				kgRefs[kg] = r
			}
		}
		var commit []checkpoint.TxnHandle
		for _, s := range snaps {
			commit = append(commit, s.Handles...)
		}
		commit = append(commit, skippedHandles[op.UID]...)
		// An operator the checkpoint does not hold (added to the job since)
		// starts fresh, as in Flink: From 0, not "restored with nothing".
		from := c.ID
		if len(snaps) == 0 && len(commit) == 0 {
			from = 0
		}
		wm := leastWatermark(snaps)
		subs := make([]*SubtaskState, op.Parallelism)
		for i := range subs {
			subs[i] = &SubtaskState{From: from, KeyGroups: kgs, CommitHandles: commit,
				AbortHandles: in.Abort[OperatorSubtask{op.UID, i}], Watermark: wm}
			out.Subtasks[OperatorSubtask{op.UID, i}] = subs[i]
		}
		same := len(snaps) == op.Parallelism
		var k int
		if op.BroadcastState && len(snaps) > 0 {
			for i, sub := range subs {
				s := snaps[i%len(snaps)]
				sub.Entries = append(sub.Entries, s.State...)
				sub.EntryRefs = append(sub.EntryRefs, s.StateRefs...)
			}
			snaps = nil // the entries are dealt; the key groups were gathered above
		}
		for _, s := range snaps {
			for _, e := range s.State {
				dst := k % op.Parallelism
				if same {
					dst = s.Subtask
				}
				if op.Union {
					for _, sub := range subs {
						sub.Entries = append(sub.Entries, e)
					}
				} else {
					subs[dst].Entries = append(subs[dst].Entries, e)
				}
				k++
			}
			for _, r := range s.StateRefs {
				dst := k % op.Parallelism
				if same {
					dst = s.Subtask
				}
				if op.Union {
					for _, sub := range subs {
						sub.EntryRefs = append(sub.EntryRefs, r)
					}
				} else {
					subs[dst].EntryRefs = append(subs[dst].EntryRefs, r)
				}
				k++
			}
		}
		for i, sub := range subs {
			sub.KeyGroups = ownedKeyGroups(kgs, op, i)
			if len(kgRefs) > 0 {
				sub.KeyGroupRefs = ownedKeyGroups(kgRefs, op, i)
			}
			if own := KeyGroupRange(i, op.MaxParallelism, op.Parallelism); op.MaxParallelism > 0 && len(own) > 0 {
				for _, s := range snaps {
					if s.Native.Overlaps(own[0], own[len(own)-1]+1) {
						sub.Native = append(sub.Native, s.Native)
					}
				}
			}
		}
	}
	return out, nil
}

// leastWatermark is where an operator's restored subtasks resume their
// watermark: the least of its snapshots' watermarks, since at another
// parallelism a subtask may take over any of their splits; none if there
// are no snapshots or one has none (that subtask had sent no watermark).
func leastWatermark(snaps []checkpoint.OperatorSnapshot) *int64 {
	var least *int64
	for _, s := range snaps {
		if s.Watermark == nil {
			return nil
		}
		if least == nil || *s.Watermark < *least {
			least = s.Watermark
		}
	}
	if least == nil {
		return nil
	}
	wm := *least
	return &wm
}

// ownedKeyGroups are the key groups of kgs that subtask i of op owns: a
// deployment carries each key group to one subtask only, not the whole
// keyed state to every subtask.
func ownedKeyGroups[V any](kgs map[int]V, op OperatorLayout, i int) map[int]V {
	if len(kgs) == 0 || op.MaxParallelism <= 0 {
		return kgs
	}
	owned := map[int]V{}
	for _, kg := range KeyGroupRange(i, op.MaxParallelism, op.Parallelism) {
		if b, ok := kgs[kg]; ok {
			owned[kg] = b
		}
	}
	return owned
}

// checkKeyGroups refuses keyed state that was split into another number of
// key groups than the operator uses now.
func checkKeyGroups(id checkpoint.ID, op OperatorLayout, s checkpoint.OperatorSnapshot) error {
	if len(s.KeyGroups) == 0 && len(s.KeyGroupRefs) == 0 && s.Native == nil {
		return nil
	}
	if op.MaxParallelism == 0 {
		return fmt.Errorf("%w: checkpoint %d holds keyed state of operator %q, which has no keyed state in the job",
			ErrIncompatibleState, id, op.UID)
	}
	if s.MaxParallelism != 0 && s.MaxParallelism != op.MaxParallelism {
		return fmt.Errorf("%w: operator %q: checkpoint %d split its keyed state into %d key groups (max parallelism %d), the job uses %d: keyed state cannot be re-split; run the job with MaxParallelism(%d)",
			ErrIncompatibleState, op.UID, id, s.MaxParallelism, s.MaxParallelism, op.MaxParallelism, s.MaxParallelism)
	}
	for kg := range keyGroupsOf(s) {
		if kg < 0 || kg >= op.MaxParallelism {
			return fmt.Errorf("%w: operator %q: checkpoint %d holds key group %d, out of the job's max parallelism %d; run the job with the max parallelism the checkpoint was taken with",
				ErrIncompatibleState, op.UID, id, kg, op.MaxParallelism)
		}
	}
	return nil
}

// keyGroupsOf yields the key groups s holds, inline or by reference.
func keyGroupsOf(s checkpoint.OperatorSnapshot) func(func(int) bool) {
	return func(yield func(int) bool) {
		for kg := range s.KeyGroups {
			if !yield(kg) {
				return
			}
		}
		for kg := range s.KeyGroupRefs {
			if !yield(kg) {
				return
			}
		}
	}
}

// pendingHandles remembers the transaction handles of acknowledged
// checkpoints that have not completed yet, so a restart can tell operators
// to abort them. A completed checkpoint n drops everything up to n (its
// transactions, and those of older aborted checkpoints, are committed or
// carried by n), so it holds at most the checkpoints in flight.
type pendingHandles struct {
	mu   sync.Mutex
	byID map[checkpoint.ID]map[OperatorSubtask][]checkpoint.TxnHandle
	done checkpoint.ID // highest completed checkpoint seen
}

func newPendingHandles() *pendingHandles {
	return &pendingHandles{byID: map[checkpoint.ID]map[OperatorSubtask][]checkpoint.TxnHandle{}}
}

func (p *pendingHandles) add(id checkpoint.ID, snap checkpoint.TaskSnapshot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if id <= p.done {
		return // a late ack of a checkpoint already covered
	}
	for _, op := range snap.Operators {
		if len(op.Handles) == 0 {
			continue
		}
		m := p.byID[id]
		if m == nil {
			m = map[OperatorSubtask][]checkpoint.TxnHandle{}
			p.byID[id] = m
		}
		k := OperatorSubtask{op.UID, op.Subtask}
		m[k] = append(m[k], op.Handles...)
	}
}

// completed forgets checkpoints up to id.
func (p *pendingHandles) completed(id checkpoint.ID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done = max(p.done, id)
	for cid := range p.byID {
		if cid <= id {
			delete(p.byID, cid)
		}
	}
}

// len is the number of checkpoints remembered.
func (p *pendingHandles) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byID)
}

// after returns the handles of checkpoints above id and forgets everything.
func (p *pendingHandles) after(id checkpoint.ID) map[OperatorSubtask][]checkpoint.TxnHandle {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[OperatorSubtask][]checkpoint.TxnHandle{}
	for cid, m := range p.byID {
		if cid > id {
			for k, hs := range m {
				out[k] = append(out[k], hs...)
			}
		}
	}
	p.byID = map[checkpoint.ID]map[OperatorSubtask][]checkpoint.TxnHandle{}
	return out
}
