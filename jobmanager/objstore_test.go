package jobmanager_test

import (
	"encoding/json"
	"errors"
	"hash/crc32"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/internal/s3server"
	"github.com/weirstream/weir/jobmanager"
	"github.com/weirstream/weir/runtime"
)

// With checkpoint storage the job manager sends its URL with every
// deployment, keeps the references the tasks acknowledge with, and a
// savepoint reads the referenced state back into itself: the savepoint is
// self-contained.
// With the checkpoint storage on S3, savepoints go to S3 too when the
// savepoint directory is a URL, opened with the checkpoint storage's
// credentials.
func TestTheStorageURLGoesWithTheDeploymentAndASavepointReadsTheReferencedState(t *testing.T) {
	for _, tc := range []struct {
		name string
		// locations returns the checkpoint storage URL and the savepoint
		// directory (or URL) under which savepoints must appear.
		locations func(t *testing.T) (storageURL, savepoints string)
	}{
		{"file storage, savepoints in a directory", func(t *testing.T) (string, string) {
			return "file://" + filepath.Join(t.TempDir(), "state"), t.TempDir()
		}},
		{"S3 storage, savepoints on S3", func(t *testing.T) (string, string) {
			srv, err := s3server.Start(t.Context(), s3server.Buckets("weir"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Close() })
			return srv.URL("weir", "cp"), srv.URL("weir", "savepoints")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, spDir := tc.locations(t)
			testASavepointReadsTheReferencedState(t, u, spDir)
		})
	}
}

func testASavepointReadsTheReferencedState(t *testing.T, u, spDir string) {
	creds := storage.Credentials("weir", "weir")
	st, err := storage.Open(t.Context(), u, creds)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s, err := jobmanager.New(jobmanager.Jobs(numbersRegistry(t)), jobmanager.HeartbeatTimeout(time.Hour),
		jobmanager.CheckpointStorage(u, creds), jobmanager.StateInlineLimit(-1), jobmanager.SavepointDir(spDir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	addr, _ := serve(t, s)
	stream := register(t, addr, "tm-1", 1)
	waitFor(t, s, "registered task manager", func(tms []jobmanager.TaskManager) bool { return len(tms) == 1 })
	jobID, err := s.Submit(t.Context(), "numbers", nil, time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	msgs := pump(t, stream)
	d := await(t, msgs, "a deployment", isDeploy).GetDeploy()
	if d.CheckpointStorage != u || d.StateInlineLimit != -1 {
		t.Fatalf("deployment carries storage %q, inline limit %d; want %q, -1", d.CheckpointStorage, d.StateInlineLimit, u)
	}
	send := func(m *weirpb.TaskManagerMessage) {
		t.Helper()
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	openDeployment(t, send, msgs, d)
	trigger, err := s.StartSavepoint(t.Context(), jobID, "", false, false)
	if err != nil {
		t.Fatal(err)
	}
	trig := await(t, msgs, "the savepoint's checkpoint trigger", func(m *weirpb.JobManagerMessage) bool { return m.GetTrigger() != nil }).GetTrigger()
	// What a task manager does: write the state, acknowledge with references.
	state := []byte("the state of key group 0")
	key := checkpoint.SharedPrefix(jobID) + "numbers_0/1-0123456789abcdef.seg"
	if err := st.Put(t.Context(), key, strings.NewReader("header "+string(state))); err != nil {
		t.Fatal(err)
	}
	ref := checkpoint.StateRef{Key: key, Offset: 7, Length: int64(len(state)), CRC: crc32.Checksum(state, crc32.MakeTable(crc32.Castagnoli)),
		Checkpoint: checkpoint.ID(trig.CheckpointId)}
	for _, task := range d.TaskIds {
		snap, err := json.Marshal(checkpoint.TaskSnapshot{Task: checkpoint.TaskID(task), Operators: []checkpoint.OperatorSnapshot{
			{UID: "numbers", Parallelism: 1, KeyGroupRefs: map[int]checkpoint.StateRef{0: ref}}}})
		if err != nil {
			t.Fatal(err)
		}
		send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Ack{Ack: &weirpb.CheckpointAck{
			JobId: d.JobId, Attempt: d.Attempt, TaskId: task, CheckpointId: trig.CheckpointId, Snapshot: snap}}})
	}
	op, err := s.WaitSavepoint(t.Context(), jobID, trigger)
	if err != nil || op.Failure != "" {
		t.Fatalf("savepoint: %+v, %v", op, err)
	}
	if want := strings.TrimSuffix(strings.Split(spDir, "?")[0], "/") + "/savepoint-"; !strings.HasPrefix(op.Location, want) {
		t.Fatalf("savepoint at %s, want it under %s", op.Location, want)
	}
	c, err := checkpoint.ReadSavepoint(t.Context(), op.Location, checkpoint.StorageOptions(creds))
	if err != nil {
		t.Fatal(err)
	}
	if refs := c.Refs(); len(refs) != 0 {
		t.Fatalf("the savepoint references checkpoint storage: %v", refs)
	}
	for _, ts := range c.Tasks {
		if got := string(ts.Operators[0].KeyGroups[0]); got != string(state) {
			t.Fatalf("savepoint key group 0 = %q, want %q", got, state)
		}
	}
}

// The job manager's checkpoint timeout is its jobs' (REST's checkpoint
// config reports it); a non-positive one is refused.
func TestTheCheckpointTimeoutIsReportedAndANonPositiveOneRefused(t *testing.T) {
	if _, err := jobmanager.New(jobmanager.CheckpointTimeout(0)); !errors.Is(err, runtime.ErrInvalidOption) {
		t.Fatalf("New with a zero checkpoint timeout: %v, want ErrInvalidOption", err)
	}
	s, _, id := submittedNumbers(t, time.Hour, jobmanager.HeartbeatTimeout(time.Hour), jobmanager.CheckpointTimeout(10*time.Minute))
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "http://localhost/jobs/"+id+"/checkpoints/config", nil)
	s.HTTPHandler().ServeHTTP(rec, req)
	var cfg struct {
		Timeout int64 `json:"timeout"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &cfg); err != nil || rec.Code != http.StatusOK || cfg.Timeout != (10*time.Minute).Milliseconds() {
		t.Fatalf("checkpoint config: %d %s (%v); want timeout %d", rec.Code, rec.Body, err, (10 * time.Minute).Milliseconds())
	}
	// A job's own timeout is what REST and the status report for it; a
	// negative one is refused at submit.
	own, err := s.Submit(t.Context(), "numbers", nil, time.Hour, "", jobmanager.JobCheckpointTimeout(90*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	rec = httptest.NewRecorder()
	s.HTTPHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://localhost/jobs/"+own+"/checkpoints/config", nil))
	if err := json.Unmarshal(rec.Body.Bytes(), &cfg); err != nil || cfg.Timeout != (90*time.Second).Milliseconds() {
		t.Fatalf("checkpoint config of a job with its own timeout: %d %s (%v); want timeout %d", rec.Code, rec.Body, err, (90 * time.Second).Milliseconds())
	}
	st, err := s.GetJob(t.Context(), &weirpb.GetJobRequest{JobId: own})
	if err != nil || st.CheckpointTimeoutMs != (90*time.Second).Milliseconds() {
		t.Fatalf("status of a job with its own timeout: %v, %v; want checkpoint_timeout_ms %d", st, err, (90 * time.Second).Milliseconds())
	}
	if _, err := s.Submit(t.Context(), "numbers", nil, time.Hour, "", jobmanager.JobCheckpointTimeout(-time.Second)); !errors.Is(err, runtime.ErrInvalidOption) {
		t.Fatalf("submit with a negative checkpoint timeout: %v, want ErrInvalidOption", err)
	}
}

// The job manager's checkpoint timeout reaches its jobs, and a job's own
// (submit --checkpoint-timeout) overrides it: a checkpoint no task
// acknowledges expires after 300 ms (the default would wait a minute) and
// REST counts it failed.
func TestACheckpointNoTaskAcknowledgesExpiresAtTheJobManagersTimeout(t *testing.T) {
	for _, tc := range []struct {
		name    string
		jm      time.Duration
		job     []jobmanager.SubmitOpt
		comment string
	}{
		{"the job manager's timeout", 300 * time.Millisecond, nil, "the job manager's 300 ms checkpoint timeout"},
		{"the job's own timeout", time.Hour, []jobmanager.SubmitOpt{jobmanager.JobCheckpointTimeout(300 * time.Millisecond)},
			"the job's own 300 ms checkpoint timeout (the job manager's is an hour)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testACheckpointNoTaskAcknowledgesExpires(t, tc.jm, tc.job, tc.comment)
		})
	}
}

func testACheckpointNoTaskAcknowledgesExpires(t *testing.T, jmTimeout time.Duration, job []jobmanager.SubmitOpt, comment string) {
	s, err := jobmanager.New(jobmanager.Jobs(numbersRegistry(t)), jobmanager.HeartbeatTimeout(time.Hour),
		jobmanager.CheckpointTimeout(jmTimeout))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	addr, _ := serve(t, s)
	stream := register(t, addr, "tm-1", 1)
	waitFor(t, s, "registered task manager", func(tms []jobmanager.TaskManager) bool { return len(tms) == 1 })
	id, err := s.Submit(t.Context(), "numbers", nil, 100*time.Millisecond, "", job...)
	if err != nil {
		t.Fatal(err)
	}
	msgs := pump(t, stream)
	d := await(t, msgs, "a deployment", isDeploy).GetDeploy()
	openDeployment(t, func(m *weirpb.TaskManagerMessage) {
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}, msgs, d)
	await(t, msgs, "a checkpoint trigger", func(m *weirpb.JobManagerMessage) bool { return m.GetTrigger() != nil })
	var stats struct {
		Counts struct {
			Failed int64 `json:"failed"`
		} `json:"counts"`
	}
	for deadline := time.Now().Add(20 * time.Second); stats.Counts.Failed == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint failed within 20 s of its trigger; %s did not reach the job", comment)
		}
		rec := httptest.NewRecorder()
		s.HTTPHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://localhost/jobs/"+id+"/checkpoints", nil))
		if err := json.Unmarshal(rec.Body.Bytes(), &stats); err != nil || rec.Code != http.StatusOK {
			t.Fatalf("checkpoints: %d %s (%v)", rec.Code, rec.Body, err)
		}
	}
}

// openDeployment answers deployment d as a task manager whose tasks
// prepared and opened: Prepared, then, once asked, Opened.
func openDeployment(t *testing.T, send func(*weirpb.TaskManagerMessage), msgs <-chan *weirpb.JobManagerMessage, d *weirpb.DeployTasks) {
	t.Helper()
	send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Prepared{Prepared: &weirpb.Prepared{
		JobId: d.JobId, Attempt: d.Attempt, DataAddress: "127.0.0.1:1"}}})
	await(t, msgs, "OpenTasks", func(m *weirpb.JobManagerMessage) bool { return m.GetOpen() != nil })
	send(&weirpb.TaskManagerMessage{Msg: &weirpb.TaskManagerMessage_Opened{Opened: &weirpb.Opened{
		JobId: d.JobId, Attempt: d.Attempt}}})
}
