package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

func h(id string, ckpt checkpoint.ID) checkpoint.TxnHandle {
	return checkpoint.TxnHandle{TransactionalID: id, ProducerID: 7, Checkpoint: ckpt}
}

func txnIDs(hs []checkpoint.TxnHandle) []string {
	var ids []string
	for _, h := range hs {
		ids = append(ids, h.TransactionalID)
	}
	slices.Sort(ids)
	return ids
}

// completedOf builds a checkpoint from operator snapshots, one task each.
func completedOf(id checkpoint.ID, ops ...checkpoint.OperatorSnapshot) checkpoint.Completed {
	c := checkpoint.Completed{Job: "j", ID: id, Tasks: map[checkpoint.TaskID]checkpoint.TaskSnapshot{}}
	for _, op := range ops {
		t := checkpoint.TaskID(fmt.Sprintf("%s#%d", op.UID, op.Subtask))
		c.Tasks[t] = checkpoint.TaskSnapshot{Task: t, Operators: []checkpoint.OperatorSnapshot{op}}
	}
	return c
}

// Every subtask of an operator must be able to commit every completed
// transaction of the operator, the skipped checkpoints' included, whichever
// subtask had them and whether or not subtask 0 had any: otherwise a subtask
// that fences its own ids first aborts a completed transaction.
func TestAssignStateGivesEveryCompletedTransactionToEverySubtaskOfItsOperator(t *testing.T) {
	c := completedOf(5,
		checkpoint.OperatorSnapshot{UID: "src", Subtask: 0, Parallelism: 1, Handles: []checkpoint.TxnHandle{h("src-0-0", 5)}},
		checkpoint.OperatorSnapshot{UID: "sink", Subtask: 0, Parallelism: 2}, // empty epoch: no handle
		checkpoint.OperatorSnapshot{UID: "sink", Subtask: 1, Parallelism: 2, Handles: []checkpoint.TxnHandle{h("sink-1-0", 5)}},
	)
	skipped := []checkpoint.Skipped{{ID: 7, HandlesOK: true, Owners: []checkpoint.HandleOwner{
		{Task: "sink#1", UID: "sink", Handles: []checkpoint.TxnHandle{h("sink-1-1", 7)}},
		{Task: "src#0", UID: "src", Handles: []checkpoint.TxnHandle{h("src-0-1", 7)}},
	}}, {ID: 6, HandlesOK: false}}
	for _, par := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("sink parallelism %d", par), func(t *testing.T) {
			as, err := AssignState([]OperatorLayout{{UID: "src", Parallelism: 1}, {UID: "sink", Parallelism: par}},
				RestoreInput{Checkpoint: c, Skipped: skipped})
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < par; i++ {
				got := txnIDs(as.Subtasks[OperatorSubtask{"sink", i}].CommitHandles)
				if want := []string{"sink-1-0", "sink-1-1"}; !slices.Equal(got, want) {
					t.Errorf("sink subtask %d commits %v, want %v", i, got, want)
				}
			}
			if got, want := txnIDs(as.Subtasks[OperatorSubtask{"src", 0}].CommitHandles), []string{"src-0-0", "src-0-1"}; !slices.Equal(got, want) {
				t.Errorf("source commits %v, want %v", got, want)
			}
			if len(as.Orphans) != 0 || len(as.NonRestored) != 0 {
				t.Errorf("orphans %v, non-restored %v; want none", as.Orphans, as.NonRestored)
			}
		})
	}
}

// orderSink records, across subtasks, when each commits and opens.
type orderSink struct {
	*txnSink
	log *violations // used as a concurrent event list
}

func (s *orderSink) CommitRestored(ctx context.Context, oc *OperatorContext) error {
	time.Sleep(20 * time.Millisecond) // a slow commit must still come first
	s.log.add(fmt.Sprintf("commit %d %v", oc.Subtask, txnIDs(oc.CommitHandles)))
	return s.txnSink.CommitRestored(ctx, oc)
}

func (s *orderSink) Open(ctx context.Context, oc *OperatorContext) error {
	s.log.add(fmt.Sprintf("open %d", oc.Subtask))
	return s.txnSink.Open(ctx, oc)
}

// On restore, the completed transactions are committed once per operator,
// by subtask 0, before any subtask of the job opens.
func TestRestoreCommitsEveryTransactionBeforeAnySubtaskOpens(t *testing.T) {
	const keys, n, par = 10, 100, 3
	store := openStore(t)
	viol, txns := &violations{}, newMemTxns()
	src := seqSourceOf(seqSource{keys: keys, splits: 2, n: n, perPoll: 1, stallAt: n / 2, pollDelay: time.Millisecond})
	latest := crashAfterPersisting(t, store, seqJob(src, viol, txns, nil, 1, par))
	want := txnIDs(latest.Handles())
	if len(want) == 0 {
		t.Fatal("the latest checkpoint holds no transaction: nothing to test")
	}

	log := &violations{}
	newSink := func() Sink[seqRec] { return &orderSink{txnSink: &txnSink{txns: txns}, log: log} }
	if _, err := NewMiniCluster(CheckpointStore(store), CheckpointInterval(5*time.Millisecond)).
		Run(t.Context(), seqJobTo(seqSourceOf(seqSource{keys: keys, splits: 2, n: n, perPoll: 3}), viol, newSink, 1, par)); err != nil {
		t.Fatal(err)
	}
	ev := log.get()
	if len(ev) != par+1 || ev[0] != fmt.Sprintf("commit 0 %v", want) {
		t.Fatalf("events %q: want first one commit by subtask 0 of %v, then %d opens", ev, want, par)
	}
	for _, e := range ev[1:] {
		if !strings.HasPrefix(e, "open ") {
			t.Fatalf("events %q: %q after the commit, want only opens", ev, e)
		}
	}
	checkSequences(t, txns.output(), keys, n)
}

// pendingHandles holds only the checkpoints in flight: a completed
// checkpoint drops itself and everything older, so a long job does not
// accumulate handles, and a late ack of a covered checkpoint is not kept.
func TestPendingHandlesForgetCompletedCheckpoints(t *testing.T) {
	p := newPendingHandles()
	snap := func(id checkpoint.ID) checkpoint.TaskSnapshot {
		return checkpoint.TaskSnapshot{Operators: []checkpoint.OperatorSnapshot{{UID: "sink", Handles: []checkpoint.TxnHandle{h(fmt.Sprint("t", id), id)}}}}
	}
	for id := checkpoint.ID(1); id <= 1000; id++ {
		p.add(id, snap(id))
		p.add(id+1, snap(id+1)) // the next one is already in flight
		p.completed(id)
		if n := p.len(); n > 1 {
			t.Fatalf("after checkpoint %d completed, %d checkpoints remembered, want at most 1", id, n)
		}
	}
	p.add(999, snap(999)) // late ack
	if got := p.after(1000); len(got) != 1 || !slices.Equal(txnIDs(got[OperatorSubtask{"sink", 0}]), []string{"t1001"}) {
		t.Fatalf("after(1000) = %v, want only checkpoint 1001's handle", got)
	}
}

// The restore rules, one by one, on the pure assignment.
func TestAssignStateRules(t *testing.T) {
	keyed := func(maxPar int, kgs ...int) checkpoint.OperatorSnapshot {
		s := checkpoint.OperatorSnapshot{UID: "count", Parallelism: 1, MaxParallelism: maxPar, KeyGroups: map[int][]byte{}}
		for _, kg := range kgs {
			s.KeyGroups[kg] = []byte{1}
		}
		return s
	}
	oldSink := checkpoint.OperatorSnapshot{UID: "old-sink", Parallelism: 1, Handles: []checkpoint.TxnHandle{h("old-0-0", 3)}}
	job := []OperatorLayout{{UID: "count", Parallelism: 2, MaxParallelism: 128}, {UID: "sink", Parallelism: 1}}
	for _, tc := range []struct {
		name        string
		c           checkpoint.Completed
		allow       bool
		wantErr     string // "" for success
		wantOrphans []string
	}{
		{"same max parallelism", completedOf(3, keyed(128, 0, 127)), false, "", nil},
		{"other max parallelism", completedOf(3, keyed(256, 0)), false, "256 key groups", nil},
		{"key group beyond the max parallelism (no recorded max)", completedOf(3, keyed(0, 200)), false, "key group 200", nil},
		{"removed operator refused", completedOf(3, keyed(128, 1), oldSink), false, "uids old-sink", nil},
		{"removed operator allowed: its transactions are orphans", completedOf(3, keyed(128, 1), oldSink), true, "", []string{"old-0-0"}},
		{"empty snapshot of a removed operator is no state", completedOf(3, checkpoint.OperatorSnapshot{UID: "gone", Parallelism: 1}), false, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			as, err := AssignState(job, RestoreInput{Checkpoint: tc.c, AllowNonRestoredState: tc.allow})
			if tc.wantErr != "" {
				if !errors.Is(err, ErrIncompatibleState) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want ErrIncompatibleState mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := txnIDs(as.Orphans); !slices.Equal(got, tc.wantOrphans) {
				t.Fatalf("orphans %v, want %v", got, tc.wantOrphans)
			}
		})
	}
}

// A restored source resumes its watermark at the least its subtasks had
// sent at the barrier, at any parallelism (a subtask may take over any
// split), and at none when one of them had sent none.
func TestAssignStateResumesASourceAtTheLeastWatermarkOfItsSubtasks(t *testing.T) {
	src := func(sub int, wm *int64) checkpoint.OperatorSnapshot {
		return checkpoint.OperatorSnapshot{UID: "src", Subtask: sub, Parallelism: 2, Watermark: wm}
	}
	at := func(wm int64) *int64 { return &wm }
	for _, tc := range []struct {
		name  string
		snaps []checkpoint.OperatorSnapshot
		want  *int64
	}{
		{"the least of the subtasks'", []checkpoint.OperatorSnapshot{src(0, at(9_000)), src(1, at(4_000))}, at(4_000)},
		{"negative event times", []checkpoint.OperatorSnapshot{src(0, at(-5)), src(1, at(3))}, at(-5)},
		{"none when a subtask had sent none", []checkpoint.OperatorSnapshot{src(0, at(9_000)), src(1, nil)}, nil},
		{"none for an operator the checkpoint does not hold", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			as, err := AssignState([]OperatorLayout{{UID: "src", Parallelism: 3}}, RestoreInput{Checkpoint: completedOf(4, tc.snaps...)})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				got := as.Subtasks[OperatorSubtask{"src", i}].Watermark
				if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
					t.Fatalf("subtask %d resumes at %v, want %v", i, deref(got), deref(tc.want))
				}
			}
		})
	}
}

func deref(p *int64) any {
	if p == nil {
		return "none"
	}
	return *p
}
