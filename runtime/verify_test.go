package runtime

import (
	"context"
	"encoding/binary"
	"errors"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
)

// verifiedSource is a seqSource that is a RestoreVerifier.
type verifiedSource struct {
	seqSource
	verify func(RestoredOperator) error
	opened *atomic.Int64
}

func (s *verifiedSource) Open(ctx context.Context, oc *OperatorContext) error {
	s.opened.Add(1)
	return s.seqSource.Open(ctx, oc)
}

func (s *verifiedSource) VerifyRestore(_ context.Context, r RestoredOperator) error {
	return s.verify(r)
}

// A RestoreVerifier operator is asked, before the first attempt opens
// anything, with the state of all its subtasks (here from 2 subtasks into
// 3): a refusal fails the job without a restart and without opening a
// subtask, and VerifyRestore gives the same answer at submit; an
// acceptance lets the job run from the checkpoint.
func TestARestoreVerifierIsAskedOnceWithEverySubtasksStateBeforeAnythingOpens(t *testing.T) {
	entry := func(split, round uint64) []byte {
		return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, split), round)
	}
	const n = 5
	c := checkpoint.Completed{Job: "old", ID: 7, Tasks: map[checkpoint.TaskID]checkpoint.TaskSnapshot{
		"source#0": {Task: "source#0", Operators: []checkpoint.OperatorSnapshot{{UID: "source", Subtask: 0, Parallelism: 2,
			State: [][]byte{entry(0, n)}, Handles: []checkpoint.TxnHandle{{TransactionalID: "t0", ProducerID: 1, Checkpoint: 7}}}}},
		"source#1": {Task: "source#1", Operators: []checkpoint.OperatorSnapshot{{UID: "source", Subtask: 1, Parallelism: 2,
			State: [][]byte{entry(1, n)}}}},
	}}
	refused := errors.New("refused")
	var mu sync.Mutex
	var asked []RestoredOperator
	job := func(verdict error, opened *atomic.Int64) *Job {
		src := func() Source[seqRec] {
			return &verifiedSource{seqSource: seqSource{keys: 4, splits: 2, n: n, perPoll: 1}, opened: opened,
				verify: func(r RestoredOperator) error {
					mu.Lock()
					defer mu.Unlock()
					asked = append(asked, r)
					return verdict
				}}
		}
		return seqJob(src, &violations{}, newMemTxns(), nil, 3, 3)
	}

	var opened atomic.Int64
	restarts := 0
	_, err := NewMiniCluster(StartFrom(c), JobID("new"), CheckpointInterval(5*time.Millisecond),
		OnRestart(func(int, error) { restarts++ })).Run(t.Context(), job(Unrecoverable(refused), &opened))
	if !errors.Is(err, ErrJobFailed) || !errors.Is(err, refused) || restarts != 0 || opened.Load() != 0 {
		t.Fatalf("run: %v, %d restarts, %d subtasks opened; want the refusal, no restart, nothing opened", err, restarts, opened.Load())
	}
	want := RestoredOperator{Job: "new", UID: "source", Checkpoint: 7, Entries: [][]byte{entry(0, n), entry(1, n)},
		Handles: []checkpoint.TxnHandle{{TransactionalID: "t0", ProducerID: 1, Checkpoint: 7}}}
	check := func(what string) {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		if len(asked) != 1 {
			t.Fatalf("%s: asked %d times, want once", what, len(asked))
		}
		got := asked[0]
		slices.SortFunc(got.Entries, func(a, b []byte) int { return slices.Compare(a, b) })
		if got.Job != want.Job || got.UID != want.UID || got.Checkpoint != want.Checkpoint ||
			!slices.EqualFunc(got.Entries, want.Entries, slices.Equal) || !reflect.DeepEqual(got.Handles, want.Handles) {
			t.Fatalf("%s: asked with %+v, want %+v", what, got, want)
		}
		asked = nil
	}
	check("run")

	if err := VerifyRestore(t.Context(), job(Unrecoverable(refused), &opened), "new", c, false); !errors.Is(err, refused) {
		t.Fatalf("VerifyRestore: %v, want the refusal", err)
	}
	check("VerifyRestore")

	if _, err := NewMiniCluster(StartFrom(c), JobID("new"), CheckpointInterval(5*time.Millisecond)).Run(t.Context(), job(nil, &opened)); err != nil {
		t.Fatalf("run with an accepting verifier: %v", err)
	}
	check("accepted run")
	if opened.Load() != 3 {
		t.Fatalf("%d subtasks opened, want 3", opened.Load())
	}
}
