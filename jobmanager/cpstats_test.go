package jobmanager

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/runtime"
)

// The checkpoint statistics count what runtime's hooks report: a trigger
// is in progress until it completes, is aborted, or its attempt ends.
func TestCheckpointStatsFollowTheHooks(t *testing.T) {
	t0 := time.Now()
	ev := func(id checkpoint.ID) runtime.CheckpointEvent {
		return runtime.CheckpointEvent{ID: id, Triggered: t0, Size: 100 * int64(id), Err: errors.New("declined")}
	}
	for _, tc := range []struct {
		name                               string
		steps                              func(s *cpStats)
		completed, failed, inProgress, rst int
		history                            []string // newest first
	}{
		{"triggered", func(s *cpStats) { s.triggered(ev(1)) }, 0, 0, 1, 0, []string{cpInProgress}},
		{"completed", func(s *cpStats) { s.triggered(ev(1)); s.completedCheckpoint(ev(1)) }, 1, 0, 0, 0, []string{cpCompleted}},
		{"aborted", func(s *cpStats) { s.triggered(ev(1)); s.abortedCheckpoint(ev(1)) }, 0, 1, 0, 0, []string{cpFailed}},
		{"restart fails those in progress", func(s *cpStats) {
			s.triggered(ev(1))
			s.completedCheckpoint(ev(1))
			s.triggered(ev(2))
			s.restart(errors.New("task failed"))
			s.restoredFrom(1)
		}, 1, 1, 0, 1, []string{cpFailed, cpCompleted}},
		{"restore from nothing is no restore", func(s *cpStats) { s.restoredFrom(0) }, 0, 0, 0, 0, nil},
		{"history keeps the last historyKept", func(s *cpStats) {
			for id := checkpoint.ID(1); id <= historyKept+2; id++ {
				s.triggered(ev(id))
				s.completedCheckpoint(ev(id))
			}
		}, historyKept + 2, 0, 0, 0, slices.Repeat([]string{cpCompleted}, historyKept)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newCPStats()
			tc.steps(s)
			snap := s.snapshot()
			if snap.Completed != tc.completed || snap.Failed != tc.failed || snap.InProgress != tc.inProgress || snap.Restored != tc.rst {
				t.Errorf("counts %+v, want completed %d failed %d in progress %d restored %d", snap, tc.completed, tc.failed, tc.inProgress, tc.rst)
			}
			if len(snap.History) != len(tc.history) {
				t.Fatalf("history %+v, want %v", snap.History, tc.history)
			}
			for i, st := range tc.history {
				if snap.History[i].Status != st {
					t.Errorf("history[%d] %+v, want %s", i, snap.History[i], st)
				}
			}
			if tc.completed > 0 && (snap.LastCompleted == nil || snap.LastCompleted.ID != checkpoint.ID(tc.completed) ||
				snap.LastCompleted.Size != 100*int64(tc.completed)) {
				t.Errorf("last completed %+v, want checkpoint %d", snap.LastCompleted, tc.completed)
			}
		})
	}
}

// Each task's acknowledgement counts once; only the newest historySize
// checkpoints keep the acknowledgements themselves (for .../details/{cid}).
func TestCheckpointStatsCountAcknowledgements(t *testing.T) {
	s := newCPStats()
	t0 := time.Now()
	for id := checkpoint.ID(1); id <= historySize+1; id++ {
		s.triggered(runtime.CheckpointEvent{ID: id, Triggered: t0})
		for _, task := range []checkpoint.TaskID{"a#0", "a#1", "a#0"} {
			s.acked(runtime.CheckpointAck{ID: id, Task: task, At: t0.Add(time.Millisecond), Size: 10, Alignment: time.Duration(id) * time.Millisecond})
		}
		s.completedCheckpoint(runtime.CheckpointEvent{ID: id, Triggered: t0, Size: 20})
	}
	snap := s.snapshot()
	for i, e := range snap.History {
		if e.Acked != 2 || e.Alignment != time.Duration(e.ID)*time.Millisecond {
			t.Errorf("checkpoint %d: %d acknowledgements, alignment %v; want 2 and %v", e.ID, e.Acked, e.Alignment, time.Duration(e.ID)*time.Millisecond)
		}
		if keeps := i < historySize; keeps != (len(e.Acks) == 2) {
			t.Errorf("checkpoint %d (newest %d) keeps %d acknowledgements", e.ID, i+1, len(e.Acks))
		}
	}
}
