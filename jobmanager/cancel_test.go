package jobmanager_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/jobmanager"
)

// A job cancelled right after its checkpoint was saved, before any task
// manager was notified: the coordinator is held at
// jm.after-checkpoint-persisted until the cancel reached the task manager.
// The CancelTasks it receives carries the saved checkpoint as the last
// completed one (a cancel for good sent between the save and the
// notification commits it); since the held coordinator does not stop in
// time, the cancel is not for good (the tasks keep their transactions) and
// the job master ends the job itself once the coordinator stopped.
func TestCancelTasksCarriesACheckpointSavedButNotNotified(t *testing.T) {
	var (
		jobID      string
		once       sync.Once
		cancelSeen = make(chan struct{})
		canceled   = make(chan error, 1)
	)
	var s *jobmanager.Server
	fp := failpoint.New(failpoint.WithHook(failpoint.JMAfterCheckpointPersisted, func() error {
		once.Do(func() {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				rec, err := s.Cancel(ctx, jobID)
				if err == nil && rec.State != jobmanager.StateCanceled {
					err = fmt.Errorf("job state %s after the cancel, want %s", rec.State, jobmanager.StateCanceled)
				}
				canceled <- err
			}()
			select {
			case <-cancelSeen:
			case <-time.After(time.Minute): // bounds the hold only: the message decides
			}
		})
		return nil
	}))
	s, err := jobmanager.New(jobmanager.Jobs(numbersRegistry(t)), jobmanager.HeartbeatTimeout(time.Hour),
		jobmanager.Failpoints(fp))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() }) // after serve's stop: cleanups run last-in first-out
	addr, _ := serve(t, s)
	st := register(t, addr, "tm-1", 1)
	waitFor(t, s, "registered task manager", func(tms []jobmanager.TaskManager) bool { return len(tms) == 1 })
	jobID, err = s.Submit(t.Context(), "numbers", nil, 50*time.Millisecond, "")
	if err != nil {
		t.Fatal(err)
	}
	msgs := pump(t, st)
	d := await(t, msgs, "a deployment", isDeploy).GetDeploy()
	send := func(m *weirpb.TaskManagerMessage) {
		t.Helper()
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Prepared{Prepared: &weirpb.Prepared{
		JobId: d.JobId, Attempt: d.Attempt, DataAddress: "127.0.0.1:1"}}})
	await(t, msgs, "OpenTasks", func(m *weirpb.JobManagerMessage) bool { return m.GetOpen() != nil })
	send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Opened{Opened: &weirpb.Opened{
		JobId: d.JobId, Attempt: d.Attempt}}})
	trig := await(t, msgs, "a checkpoint trigger", func(m *weirpb.JobManagerMessage) bool { return m.GetTrigger() != nil }).GetTrigger()
	snap, err := json.Marshal(checkpoint.TaskSnapshot{})
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range d.TaskIds {
		send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Ack{Ack: &weirpb.CheckpointAck{
			JobId: d.JobId, Attempt: d.Attempt, TaskId: task, CheckpointId: trig.CheckpointId, Snapshot: snap}}})
	}
	// The job's cancel waits for the held coordinator (10s) before it
	// cancels the tasks.
	var c *weirpb.CancelTasks
	for wait := time.After(time.Minute); c == nil; {
		select {
		case m, ok := <-msgs:
			if !ok {
				t.Fatal("the session ended before CancelTasks")
			}
			c = m.GetCancel()
		case <-wait:
			t.Fatal("no CancelTasks within a minute")
		}
	}
	close(cancelSeen)
	if c.ForGood || c.LastCompleted != trig.CheckpointId {
		t.Errorf("CancelTasks for good %v with last completed checkpoint %d, want not for good (the coordinator is held) with %d (saved)",
			c.ForGood, c.LastCompleted, trig.CheckpointId)
	}
	send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Ended{Ended: &weirpb.DeploymentEnded{
		JobId: d.JobId, Attempt: d.Attempt}}})
	if err := <-canceled; err != nil {
		t.Fatalf("cancel: %v", err)
	}
}
