package jobmanager_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/jobmanager"
)

// restGet GETs path from s's REST API and decodes the JSON answer into v.
func restGet(t *testing.T, s *jobmanager.Server, path string, v any) {
	t.Helper()
	hs := httptest.NewServer(s.HTTPHandler())
	defer hs.Close()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, hs.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hs.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %q %v", path, resp.StatusCode, b, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v: %q", path, err, b)
	}
}

// flinkExceptions is Flink's JobExceptionsInfoWithHistory, as a tool
// written for Flink's REST API reads it.
type flinkExceptions struct {
	RootException    *string          `json:"root-exception"`
	Timestamp        *int64           `json:"timestamp"`
	AllExceptions    []map[string]any `json:"all-exceptions"`
	Truncated        *bool            `json:"truncated"`
	ExceptionHistory struct {
		Entries []struct {
			ExceptionName        string            `json:"exceptionName"`
			Stacktrace           string            `json:"stacktrace"`
			Timestamp            int64             `json:"timestamp"`
			TaskName             *string           `json:"taskName"`
			Location             *string           `json:"location"`
			Endpoint             *string           `json:"endpoint"`
			TaskManagerID        *string           `json:"taskManagerId"`
			FailureLabels        map[string]string `json:"failureLabels"`
			ConcurrentExceptions []any             `json:"concurrentExceptions"`
		} `json:"entries"`
		Truncated *bool `json:"truncated"`
	} `json:"exceptionHistory"`
}

// Every failure of a job is in its exception history (GET
// /jobs/{id}/exceptions in Flink's shape, the latest in the job's status),
// newest first, bounded to Flink's default of 16 entries with the older
// ones said to be truncated, and the history is kept in the job store: a
// job manager restarted on the same data directory shows it again.
func TestTheExceptionHistoryKeepsTheLatestFailuresAcrossAJobManagerRestart(t *testing.T) {
	const failures = jobmanager.ExceptionHistorySize + 1
	reg := numbersRegistry(t)
	dir := t.TempDir()
	first, err := jobmanager.New(jobmanager.Jobs(reg), jobmanager.DataDir(dir), jobmanager.HeartbeatTimeout(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	addr, stop := serve(t, first)
	st := register(t, addr, "tm-1", 1)
	waitFor(t, first, "registered task manager", func(tms []jobmanager.TaskManager) bool { return len(tms) == 1 })
	id, err := first.Submit(t.Context(), "numbers", nil, time.Second, fmt.Sprintf("fixed-delay:attempts=%d,delay=1ms", failures+5),
		jobmanager.JobName("numbers under test"))
	if err != nil {
		t.Fatal(err)
	}
	msgs := pump(t, st)
	for i := 1; i <= failures; i++ {
		d := await(t, msgs, fmt.Sprintf("deployment %d", i), isDeploy).GetDeploy()
		if err := st.Send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Prepared{Prepared: &weirpb.Prepared{
			JobId: d.JobId, Attempt: d.Attempt, Error: fmt.Sprintf("failure %d", i)}}}); err != nil {
			t.Fatal(err)
		}
	}
	// The next deployment comes after the last failure was recorded; it is
	// being prepared when the job manager stops, and is cancelled then.
	next := await(t, msgs, "the deployment after the last failure", isDeploy).GetDeploy()
	go func() {
		for m := range msgs {
			if c := m.GetCancel(); c != nil && c.Attempt == next.Attempt {
				_ = st.Send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Prepared{Prepared: &weirpb.Prepared{
					JobId: next.JobId, Attempt: next.Attempt, Error: "context canceled"}}})
			}
		}
	}()

	check := func(s *jobmanager.Server, addr, when string) {
		t.Helper()
		var got flinkExceptions
		restGet(t, s, "/jobs/"+id+"/exceptions", &got)
		h := got.ExceptionHistory
		if len(h.Entries) != jobmanager.ExceptionHistorySize || h.Truncated == nil || !*h.Truncated {
			t.Fatalf("%s: %d history entries, truncated %v; want %d, true", when, len(h.Entries), h.Truncated, jobmanager.ExceptionHistorySize)
		}
		for i, e := range h.Entries {
			want := fmt.Sprintf("task manager tm-1: failure %d", failures-i) // newest first
			if e.ExceptionName != want || !strings.HasPrefix(e.Stacktrace, want) || e.Timestamp <= 0 {
				t.Errorf("%s: entry %d is %q (stacktrace %q, timestamp %d), want %q", when, i, e.ExceptionName, e.Stacktrace, e.Timestamp, want)
			}
			if e.TaskManagerID == nil || *e.TaskManagerID != "tm-1" || e.Location == nil || *e.Location != "tm-1" {
				t.Errorf("%s: entry %d located on %v/%v, want tm-1", when, i, e.TaskManagerID, e.Location)
			}
			if e.TaskName != nil || e.FailureLabels == nil || e.ConcurrentExceptions == nil {
				t.Errorf("%s: entry %d: taskName %v (a deployment failure is no task's), failureLabels %v, concurrentExceptions %v",
					when, i, e.TaskName, e.FailureLabels, e.ConcurrentExceptions)
			}
		}
		latest := fmt.Sprintf("task manager tm-1: failure %d", failures)
		if got.RootException == nil || !strings.HasPrefix(*got.RootException, latest) || got.Timestamp == nil ||
			*got.Timestamp != h.Entries[0].Timestamp || got.AllExceptions == nil || got.Truncated == nil {
			t.Errorf("%s: root-exception %v at %v, all-exceptions %v, truncated %v; want %q at the newest entry's time",
				when, got.RootException, got.Timestamp, got.AllExceptions, got.Truncated, latest)
		}
		cc, err := rpc.Dial(addr)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		js, err := weirpb.NewJobManagerClient(cc).GetJob(t.Context(), &weirpb.GetJobRequest{JobId: id})
		if err != nil {
			t.Fatal(err)
		}
		if f := js.LastFailure; f == nil || f.Message != latest || f.TaskManager != "tm-1" || !f.Restarted {
			t.Errorf("%s: status's last failure %v, want %q on tm-1, restarted", when, f, latest)
		}
		if js.Name != "numbers under test" || js.JobType != "numbers" {
			t.Errorf("%s: status names the job %q of type %q, want %q of type numbers", when, js.Name, js.JobType, "numbers under test")
		}
	}
	check(first, addr, "running")

	stop()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second, err := jobmanager.New(jobmanager.Jobs(reg), jobmanager.DataDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Close() }) // after serve's stop: cleanups run last-in first-out
	addr, _ = serve(t, second)
	check(second, addr, "after a job manager restart")
}

// A job waiting for slots says why in its status (the control plane the
// CLI reads, and REST), and the job manager logs the wait once.
func TestAJobWaitingForSlotsSaysWhy(t *testing.T) {
	logged := make(chan string, 16)
	s, addr, id := resumedJobWaitingForSlots(t, func(e zapcore.Entry) {
		if e.Message == "waiting for task manager slots" {
			logged <- e.Message
		}
	})
	const want = "waiting for 1 slot, 0 free"
	rec, _, err := s.Job(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != jobmanager.StateCreated || rec.Waiting != want {
		t.Fatalf("job %s, waiting %q; want %s, %q", rec.State, rec.Waiting, jobmanager.StateCreated, want)
	}
	var details struct {
		State   string `json:"state"`
		Waiting string `json:"waiting"`
	}
	restGet(t, s, "/jobs/"+id, &details)
	if details.Waiting != want {
		t.Errorf("REST job details: waiting %q, want %q", details.Waiting, want)
	}
	cc, err := rpc.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	st, err := weirpb.NewJobManagerClient(cc).GetJob(t.Context(), &weirpb.GetJobRequest{JobId: id})
	if err != nil {
		t.Fatal(err)
	}
	if st.Waiting != want {
		t.Errorf("GetJob: waiting %q, want %q", st.Waiting, want)
	}
	// Once a task manager offers the slot, the job no longer waits.
	register(t, addr, "tm-2", 1)
	deadline := time.Now().Add(30 * time.Second)
	for {
		rec, _, err := s.Job(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Waiting == "" && rec.State != jobmanager.StateCreated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job still %s, waiting %q, 30s after a task manager offered the slot", rec.State, rec.Waiting)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := len(logged); n != 1 {
		t.Errorf("the wait was logged %d times, want once", n)
	}
}

// A job waiting out its restart strategy's delay says when its next
// attempt starts: in its record, its status (GetJob's
// next_attempt_unix_ms, what `status` prints) and REST's job details
// (next_attempt_at); once the job no longer waits, none of them does.
func TestARestartingJobSaysWhenItsNextAttemptStarts(t *testing.T) {
	const delay = time.Hour
	reg := numbersRegistry(t)
	s, err := jobmanager.New(jobmanager.Jobs(reg), jobmanager.DataDir(t.TempDir()), jobmanager.HeartbeatTimeout(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	addr, _ := serve(t, s)
	st := register(t, addr, "tm-1", 1)
	waitFor(t, s, "registered task manager", func(tms []jobmanager.TaskManager) bool { return len(tms) == 1 })
	id, err := s.Submit(t.Context(), "numbers", nil, time.Second, "fixed-delay:attempts=3,delay="+delay.String())
	if err != nil {
		t.Fatal(err)
	}
	msgs := pump(t, st)
	d := await(t, msgs, "the first deployment", isDeploy).GetDeploy()
	failed := time.Now()
	if err := st.Send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Prepared{Prepared: &weirpb.Prepared{
		JobId: d.JobId, Attempt: d.Attempt, Error: "the input topic does not exist"}}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	var rec jobmanager.JobRecord
	for {
		if rec, _, err = s.Job(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		if rec.State == jobmanager.StateRestarting && rec.NextAttemptUnixMs != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s, next attempt at %d, 30s after its deployment failed; want RESTARTING with a next attempt", rec.State, rec.NextAttemptUnixMs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	at := time.UnixMilli(rec.NextAttemptUnixMs)
	if lo, hi := failed.Add(delay), time.Now().Add(delay); at.Before(lo.Add(-time.Millisecond)) || at.After(hi.Add(time.Millisecond)) {
		t.Errorf("next attempt at %v, want the failure's time plus the %v delay (%v..%v)", at, delay, lo, hi)
	}
	var details struct {
		State         string `json:"state"`
		NextAttemptAt int64  `json:"next_attempt_at"`
	}
	restGet(t, s, "/jobs/"+id, &details)
	if details.NextAttemptAt != rec.NextAttemptUnixMs {
		t.Errorf("REST job details: next_attempt_at %d, want %d", details.NextAttemptAt, rec.NextAttemptUnixMs)
	}
	cc, err := rpc.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	js, err := weirpb.NewJobManagerClient(cc).GetJob(t.Context(), &weirpb.GetJobRequest{JobId: id})
	if err != nil {
		t.Fatal(err)
	}
	if js.NextAttemptUnixMs != rec.NextAttemptUnixMs {
		t.Errorf("GetJob: next_attempt_unix_ms %d, want %d", js.NextAttemptUnixMs, rec.NextAttemptUnixMs)
	}
	// Cancelled while it waits, the job waits for nothing.
	if _, err := s.Cancel(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	if rec, _, err = s.Job(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	if rec.State != jobmanager.StateCanceled || rec.NextAttemptUnixMs != 0 {
		t.Errorf("cancelled: job %s, next attempt at %d; want CANCELED and none", rec.State, rec.NextAttemptUnixMs)
	}
	details.NextAttemptAt = 0
	restGet(t, s, "/jobs/"+id, &details)
	if details.NextAttemptAt != 0 {
		t.Errorf("cancelled: REST next_attempt_at %d, want none", details.NextAttemptAt)
	}
}

// A job's final record counts are those its tasks ended with (sent with
// the end of the deployment), not those of the last heartbeat: what a
// drain's final watermark or a bounded input's end fired after it counts
// (Nexmark q5 stopped with --drain reported 7 records out against 15
// written).
func TestAJobsFinalCountsAreThoseItsTasksEndedWith(t *testing.T) {
	s, err := jobmanager.New(jobmanager.Jobs(numbersRegistry(t)), jobmanager.DataDir(t.TempDir()), jobmanager.HeartbeatTimeout(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	addr, _ := serve(t, s)
	st := register(t, addr, "tm-1", 1)
	waitFor(t, s, "registered task manager", func(tms []jobmanager.TaskManager) bool { return len(tms) == 1 })
	id, err := s.Submit(t.Context(), "numbers", nil, time.Hour, "")
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
	openDeployment(t, send, msgs, d)
	canceled := make(chan error, 1)
	go func() { _, err := s.Cancel(t.Context(), id); canceled <- err }()
	await(t, msgs, "CancelTasks", func(m *weirpb.JobManagerMessage) bool { return m.GetCancel() != nil })
	final := &weirpb.TaskCounts{TaskId: d.TaskIds[0], RecordsIn: 3, RecordsOut: 3, Source: true, Sink: true}
	send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Ended{Ended: &weirpb.DeploymentEnded{
		JobId: d.JobId, Attempt: d.Attempt, Tasks: []*weirpb.TaskCounts{final}}}})
	if err := <-canceled; err != nil {
		t.Fatal(err)
	}
	rec, _, err := s.Job(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != jobmanager.StateCanceled || rec.Records.In != 3 || rec.Records.Out != 3 {
		t.Errorf("job %s with records %+v, want CANCELED with the 3 in and 3 out its tasks ended with", rec.State, rec.Records)
	}
}
