package runtime

import (
	"encoding/json"
	"fmt"

	"github.com/weirstream/weir/checkpoint"
)

// What a job manager sends a task manager about an attempt, and back
// (docs/architecture.md, "Cluster"): the restore assignment and task
// snapshots travel as JSON.

// IsUnrecoverable reports whether err is a failure a restart cannot fix: an
// invalid job, option or restored state, or one wrapped by Unrecoverable. A
// job master fails the job on such an error instead of restarting it.
func IsUnrecoverable(err error) bool { return isConfigError(err) }

type wireSubtask struct {
	UID     string        `json:"uid"`
	Subtask int           `json:"subtask"`
	State   *SubtaskState `json:"state"`
}

type wireAssignment struct {
	From        checkpoint.ID          `json:"from"`
	Subtasks    []wireSubtask          `json:"subtasks,omitempty"`
	Orphans     []checkpoint.TxnHandle `json:"orphans,omitempty"`
	NonRestored []string               `json:"non_restored,omitempty"`
}

// MarshalJSON encodes the assignment for another process.
func (a *StateAssignment) MarshalJSON() ([]byte, error) {
	w := wireAssignment{From: a.From, Orphans: a.Orphans, NonRestored: a.NonRestored}
	for k, st := range a.Subtasks {
		w.Subtasks = append(w.Subtasks, wireSubtask{UID: k.UID, Subtask: k.Subtask, State: st})
	}
	return json.Marshal(w)
}

// UnmarshalJSON decodes what MarshalJSON encoded.
func (a *StateAssignment) UnmarshalJSON(b []byte) error {
	var w wireAssignment
	if err := json.Unmarshal(b, &w); err != nil {
		return fmt.Errorf("decode state assignment: %w", err)
	}
	*a = StateAssignment{From: w.From, Subtasks: make(map[OperatorSubtask]*SubtaskState, len(w.Subtasks)),
		Orphans: w.Orphans, NonRestored: w.NonRestored}
	for _, s := range w.Subtasks {
		if s.State == nil {
			return fmt.Errorf("decode state assignment: no state for %s/%d", s.UID, s.Subtask)
		}
		a.Subtasks[OperatorSubtask{s.UID, s.Subtask}] = s.State
	}
	return nil
}
