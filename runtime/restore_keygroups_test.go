package runtime

import (
	"fmt"
	"testing"

	"github.com/weirstream/weir/checkpoint"
)

// Each key group of a restored checkpoint goes to the one subtask that owns
// it, whatever the parallelism the checkpoint was taken at: a deployment
// carries the keyed state once, not once per subtask.
func TestRestoreAssignsEachKeyGroupToItsOwnerOnly(t *testing.T) {
	const maxPar = 16
	for _, tc := range []struct{ from, to int }{{2, 2}, {2, 3}, {4, 1}, {1, 4}} {
		t.Run(fmt.Sprintf("%d to %d", tc.from, tc.to), func(t *testing.T) {
			c := checkpoint.Completed{ID: 7, Tasks: map[checkpoint.TaskID]checkpoint.TaskSnapshot{}}
			for s := range tc.from {
				kgs := map[int][]byte{}
				for _, kg := range KeyGroupRange(s, maxPar, tc.from) {
					kgs[kg] = []byte{byte(kg)}
				}
				c.Tasks[checkpoint.TaskID(fmt.Sprint("t", s))] = checkpoint.TaskSnapshot{Operators: []checkpoint.OperatorSnapshot{
					{UID: "count", Subtask: s, Parallelism: tc.from, MaxParallelism: maxPar, KeyGroups: kgs}}}
			}
			as, err := AssignState([]OperatorLayout{{UID: "count", Parallelism: tc.to, MaxParallelism: maxPar}}, RestoreInput{Checkpoint: c})
			if err != nil {
				t.Fatal(err)
			}
			owner := map[int]int{}
			for s := range tc.to {
				for kg, b := range as.Subtasks[OperatorSubtask{"count", s}].KeyGroups {
					if prev, ok := owner[kg]; ok {
						t.Fatalf("key group %d assigned to subtasks %d and %d", kg, prev, s)
					}
					if SubtaskOf(kg, maxPar, tc.to) != s {
						t.Fatalf("key group %d assigned to subtask %d, owned by %d", kg, s, SubtaskOf(kg, maxPar, tc.to))
					}
					if len(b) != 1 || int(b[0]) != kg {
						t.Fatalf("key group %d restored as %x", kg, b)
					}
					owner[kg] = s
				}
			}
			if len(owner) != maxPar {
				t.Fatalf("%d of %d key groups assigned", len(owner), maxPar)
			}
		})
	}
}
