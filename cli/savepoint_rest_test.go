package cli

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/rpc"
)

// postJSON POSTs body as JSON and returns the status and the answer.
func postJSON(t *testing.T, url, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(rpc.RequestHeader, "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// flinkSavepointResult is Flink's AsynchronousOperationResult of a
// savepoint.
type flinkSavepointResult struct {
	Status struct {
		ID string `json:"id"`
	} `json:"status"`
	Operation *struct {
		Location     *string `json:"location"`
		FailureCause *string `json:"failure-cause"`
	} `json:"operation"`
}

// triggerAndWait POSTs a savepoint or stop request in Flink's shape and
// polls its trigger id until COMPLETED; it returns the savepoint's location.
func triggerAndWait(t *testing.T, jm, path, body string) string {
	t.Helper()
	code, b := postJSON(t, jm+path, body)
	var trig struct {
		RequestID string `json:"request-id"`
	}
	if err := json.Unmarshal(b, &trig); code != http.StatusAccepted || err != nil || trig.RequestID == "" {
		t.Fatalf("POST %s: %d %s, want 202 with a request-id", path, code, b)
	}
	status := jm + strings.TrimSuffix(strings.TrimSuffix(path, "/stop"), "/savepoints") + "/savepoints/" + trig.RequestID
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var r flinkSavepointResult
		getJSON(t, status, &r)
		switch r.Status.ID {
		case "COMPLETED":
			if r.Operation == nil || r.Operation.Location == nil || r.Operation.FailureCause != nil {
				t.Fatalf("GET %s: COMPLETED without a location: %+v", status, r.Operation)
			}
			return *r.Operation.Location
		case "IN_PROGRESS":
		default:
			t.Fatalf("GET %s: status %q", status, r.Status.ID)
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: still IN_PROGRESS after 60s", status)
		}
	}
}

// The REST API triggers a savepoint and a stop-with-savepoint in Flink's
// shapes (202 with a request-id, then the operation's status polled until
// COMPLETED with the location), lists them for the dashboard, refuses what
// it cannot do (no target directory, cancel-job) with 400, and the
// stopped job ends FINISHED with its output exactly-once.
func TestRESTTriggersSavepointsAndStopsAJobInFlinksShapes(t *testing.T) {
	dir := t.TempDir()
	c := startLocal(t, "--taskmanagers", "1", "--slots", "2", "--savepoint-allowed-locations", dir)
	jm := "http://" + c.addr(t, "jobmanager http on")
	lines := testLines(400, "s")
	produceLines(t, c.broker, "lines", lines)
	id := c.submitWordcount(t, "100ms")
	waitCounted(t, c.broker, "counts", wordcount.Expected(lines))

	for _, bad := range []struct{ path, body, want string }{
		{"/savepoints", `{}`, "--savepoint-dir"},
		{"/savepoints", `{"target-directory":"` + dir + `","cancel-job":true}`, "cancel-job"},
	} {
		code, b := postJSON(t, jm+"/jobs/"+id+bad.path, bad.body)
		if code != http.StatusBadRequest || !strings.Contains(string(b), bad.want) {
			t.Errorf("POST %s %s: %d %s, want 400 naming %s", bad.path, bad.body, code, b, bad.want)
		}
	}
	if code, b := httpDo(t, http.MethodGet, jm+"/jobs/"+id+"/savepoints/nosuchtrigger"); code != http.StatusNotFound {
		t.Errorf("GET an unknown trigger: %d %s, want 404", code, b)
	}

	sp := triggerAndWait(t, jm, "/jobs/"+id+"/savepoints", `{"target-directory":"`+dir+`","cancel-job":false}`)
	// streamctl savepoint prints the directory it wrote; a savepoint
	// without --target on a job manager without --savepoint-dir fails.
	out, err := c.cli(t, "savepoint", id, "--target", dir)
	if cliSP := strings.TrimSpace(out); err != nil || filepath.Dir(cliSP) != dir || cliSP == sp {
		t.Fatalf("savepoint --target %s: %q, %v; want a new directory under it", dir, out, err)
	}
	if out, err := c.cli(t, "savepoint", id); err == nil || !strings.Contains(err.Error(), "--savepoint-dir") {
		t.Errorf("savepoint without --target: %q, %v; want an error naming --savepoint-dir", out, err)
	}
	stop := triggerAndWait(t, jm, "/jobs/"+id+"/stop", `{"targetDirectory":"`+dir+`","drain":false}`)
	for _, loc := range []string{sp, stop} {
		if filepath.Dir(loc) != dir {
			t.Errorf("savepoint location %s, want one under %s", loc, dir)
		}
		if _, err := os.Stat(filepath.Join(loc, "_metadata")); err != nil {
			t.Errorf("savepoint %s: %v", loc, err)
		}
	}
	if sp == stop {
		t.Errorf("the savepoint and the stop wrote the same directory %s", sp)
	}
	for deadline := time.Now().Add(30 * time.Second); c.status(t, id).State != "FINISHED"; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("job after stop: %+v, want FINISHED", c.status(t, id))
		}
	}
	var list struct {
		Savepoints []struct {
			Status     string `json:"status"`
			Location   string `json:"location"`
			Checkpoint uint64 `json:"checkpoint"`
			Stop       bool   `json:"stop"`
		} `json:"savepoints"`
	}
	getJSON(t, jm+"/jobs/"+id+"/savepoints", &list)
	if n := len(list.Savepoints); n != 3 || list.Savepoints[0].Location != sp || list.Savepoints[n-1].Location != stop ||
		!list.Savepoints[n-1].Stop || list.Savepoints[0].Checkpoint == 0 || list.Savepoints[n-1].Checkpoint <= list.Savepoints[0].Checkpoint {
		t.Errorf("GET /jobs/%s/savepoints: %+v, want the two savepoints then the stop", id, list.Savepoints)
	}
	if code, b := postJSON(t, jm+"/jobs/"+id+"/savepoints", `{"target-directory":"`+dir+`"}`); code != http.StatusConflict {
		t.Errorf("savepoint of a finished job: %d %s, want 409", code, b)
	}
	waitCounted(t, c.broker, "counts", wordcount.Expected(lines))
}

// A job submitted with --retain-on-cancel leaves its latest completed
// checkpoint as a savepoint when cancelled (under the job manager's data
// directory without --savepoint-dir); cancel and status name it, and a job
// started from it continues the count exactly-once, record by record.
func TestRetainOnCancelLeavesASavepointThatContinuesTheJob(t *testing.T) {
	c := startLocal(t, "--taskmanagers", "1", "--slots", "2", "--data-dir", t.TempDir())
	first := testLines(300, "r")
	produceLines(t, c.broker, "lines", first)
	out, err := c.cli(t, "submit", "wordcount", "--parallelism", "2", "--checkpoint-interval", "100ms",
		"--set", "brokers="+c.broker, "--retain-on-cancel")
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	waitCounted(t, c.broker, "counts", wordcount.Expected(first))
	out, err = c.cli(t, "cancel", id, "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	var st jobJSON
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.State != "CANCELED" || st.RetainedSavepoint == "" {
		t.Fatalf("cancel printed %q (%v), want CANCELED with a retained savepoint", out, err)
	}
	if _, err := os.Stat(filepath.Join(st.RetainedSavepoint, "_metadata")); err != nil {
		t.Fatalf("retained savepoint: %v", err)
	}
	if got := c.status(t, id).RetainedSavepoint; got != st.RetainedSavepoint {
		t.Errorf("status names retained savepoint %q, cancel %q", got, st.RetainedSavepoint)
	}
	// Retained: the job's checkpoints stay too.
	if out, err := c.cli(t, "checkpoints", id, "--output", "json"); err != nil || strings.TrimSpace(out) == "[]" {
		t.Fatalf("checkpoints of the job cancelled with --retain-on-cancel: %q, %v; want them kept", out, err)
	}

	second := testLines(300, "q")
	produceLines(t, c.broker, "lines", second)
	out, err = c.cli(t, "submit", "wordcount", "--parallelism", "1", "--checkpoint-interval", "100ms",
		"--set", "brokers="+c.broker, "--from-savepoint", st.RetainedSavepoint)
	if err != nil {
		t.Fatal(err)
	}
	waitCounted(t, c.broker, "counts", wordcount.Expected(append(first, second...)))
	// REST says the job restored a savepoint, and where it is (Flink's
	// latest.restored), not an anonymous checkpoint.
	var cps struct {
		Latest struct {
			Restored *struct {
				ID           uint64 `json:"id"`
				IsSavepoint  bool   `json:"is_savepoint"`
				ExternalPath string `json:"external_path"`
			} `json:"restored"`
		} `json:"latest"`
	}
	getJSON(t, "http://"+c.addr(t, "jobmanager http on")+"/jobs/"+strings.TrimSpace(out)+"/checkpoints", &cps)
	if r := cps.Latest.Restored; r == nil || !r.IsSavepoint || r.ExternalPath != st.RetainedSavepoint {
		t.Errorf("checkpoints' latest.restored %+v, want the savepoint %s", r, st.RetainedSavepoint)
	}
}
