package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/weirstream/weir/jobmanager"
	"github.com/weirstream/weir/runtime"
)

// A deployment that cannot be sent because it is larger than the control
// plane's message limit (here: 5 MiB of job parameters) fails the job at
// once with that cause, and the task managers keep their sessions: before,
// the task manager's stream broke on it, the job manager logged only
// "connection closed: context canceled", and the job restarted forever.
func TestADeploymentTooLargeToSendFailsTheJobWithItsCause(t *testing.T) {
	reg := runtime.NewRegistry()
	err := reg.Register(runtime.JobType{Name: "numbers", Params: []runtime.ParamSpec{{Name: "blob"}},
		Build: func(runtime.Params) (*runtime.Job, error) {
			job := runtime.NewJob("numbers", runtime.DefaultParallelism(2))
			nums := runtime.FromSource(job, "numbers", runtime.SliceSource([]int{1, 2, 3}, 0))
			runtime.SinkTo(nums, "discard", runtime.SinkFunc(func(context.Context, int) error { return nil }))
			return job, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, reg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), nil)
	c.startTM("tm-1")
	c.startTM("tm-2")
	waitUntil(t, time.Minute, "two task managers registered", func() bool { return len(c.srv.TaskManagers()) == 2 })
	sessions := map[string]uint64{}
	for _, tm := range c.srv.TaskManagers() {
		sessions[tm.ID] = tm.Session
	}

	ctx := t.Context()
	id, err := c.srv.Submit(ctx, "numbers", map[string]string{"blob": strings.Repeat("x", 5<<20)}, time.Second, "")
	if err != nil {
		t.Fatal(err)
	}
	var rec jobmanager.JobRecord
	waitUntil(t, 2*time.Minute, "the job ended", func() bool {
		rec, _, err = c.srv.Job(ctx, id)
		return err == nil && (rec.State == jobmanager.StateFailed || rec.State == jobmanager.StateFinished)
	})
	if rec.State != jobmanager.StateFailed || !strings.Contains(rec.Error, "message larger than the limit") {
		t.Fatalf("job %s with error %q; want FAILED saying the deployment is larger than the message limit", rec.State, rec.Error)
	}
	if rec.Restarts != 0 {
		t.Fatalf("the job restarted %d times; sending the same deployment again cannot succeed", rec.Restarts)
	}
	for _, tm := range c.srv.TaskManagers() {
		if sessions[tm.ID] != tm.Session {
			t.Fatalf("task manager %s registered again (session %d, was %d): its session broke", tm.ID, tm.Session, sessions[tm.ID])
		}
	}
	if len(c.srv.TaskManagers()) != 2 {
		t.Fatalf("task managers %v; want both still registered", c.srv.TaskManagers())
	}
}
