package cli

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/rpc"
)

// addr waits for local to print "PREFIX HOST:PORT" and returns the address.
func (c *localCluster) addr(t *testing.T, prefix string) string {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(prefix) + ` (\S+)$`)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m := re.FindStringSubmatch(c.out.String()); m != nil {
			return m[1]
		}
	}
	t.Fatalf("local did not print %q: %q", prefix, c.out.String())
	return ""
}

// httpDo makes one request and returns the status and body. It is a
// script, not a browser: it marks its requests with rpc.RequestHeader.
func httpDo(t *testing.T, method, url string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
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

// getJSON GETs url, expects 200 and decodes the body into v.
func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	code, b := httpDo(t, http.MethodGet, url)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, code, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, b)
	}
}

// scrape parses a /metrics page.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	code, b := httpDo(t, http.MethodGet, url)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, code, b)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(b)))
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	return fams
}

// sample is one series of a scraped family.
type sample struct {
	labels map[string]string
	value  float64
}

func samples(fams map[string]*dto.MetricFamily, name string) []sample {
	var out []sample
	f := fams[name]
	if f == nil {
		return nil
	}
	for _, m := range f.Metric {
		s := sample{labels: map[string]string{}}
		for _, l := range m.Label {
			s.labels[l.GetName()] = l.GetValue()
		}
		switch {
		case m.Counter != nil:
			s.value = m.Counter.GetValue()
		case m.Gauge != nil:
			s.value = m.Gauge.GetValue()
		}
		out = append(out, s)
	}
	return out
}

// jobValue is the value of a job's series of name, and whether it exists.
func jobValue(fams map[string]*dto.MetricFamily, name, job string) (float64, bool) {
	for _, s := range samples(fams, name) {
		if s.labels["job_id"] == job {
			return s.value, true
		}
	}
	return 0, false
}

// restJob is the part of GET /jobs/{id} the test reads.
type restJob struct {
	ID       string `json:"jid"`
	Name     string `json:"name"`
	State    string `json:"state"`
	Start    int64  `json:"start-time"`
	Last     uint64 `json:"last_completed_checkpoint"`
	Vertices []struct {
		ID          string `json:"id"`
		Name        string `json:"name"`
		Parallelism int    `json:"parallelism"`
		Status      string `json:"status"`
		Metrics     struct {
			Read  int64 `json:"read-records"`
			Write int64 `json:"write-records"`
		} `json:"metrics"`
		Subtasks []struct {
			TaskID      string `json:"task_id"`
			TaskManager string `json:"taskmanager-id"`
			Status      string `json:"status"`
			Start       int64  `json:"start-time"`
			End         int64  `json:"end-time"`
			Duration    int64  `json:"duration"`
		} `json:"subtasks"`
	} `json:"vertices"`
	Plan struct {
		Nodes []struct {
			ID     string `json:"id"`
			Inputs []struct {
				ID   string `json:"id"`
				Ship string `json:"ship_strategy"`
			} `json:"inputs"`
		} `json:"nodes"`
	} `json:"plan"`
}

type restCheckpoints struct {
	Counts struct {
		Completed, Failed, Total int
		InProgress               int `json:"in_progress"`
	} `json:"counts"`
	Latest struct {
		Completed *struct {
			ID        uint64 `json:"id"`
			StateSize int64  `json:"state_size"`
		} `json:"completed"`
	} `json:"latest"`
	History []struct {
		ID       uint64 `json:"id"`
		Status   string `json:"status"`
		Trigger  int64  `json:"trigger_timestamp"`
		Duration int64  `json:"end_to_end_duration"`
	} `json:"history"`
}

// While wordcount runs on a local cluster, the job manager's /metrics
// shows its completed checkpoints moving, the task managers' /metrics
// every task's records in and out, the REST API the job, its graph, its
// tasks' placement and its checkpoints, and a POST cancel ends it.
func TestMetricsAndRESTShowARunningJob(t *testing.T) {
	c := startLocal(t, "--taskmanagers", "2", "--slots", "2", "--metrics", "127.0.0.1:0")
	jm := "http://" + c.addr(t, "jobmanager http on")
	tmMetrics := "http://" + c.addr(t, "taskmanager metrics on") + "/metrics"
	lines := testLines(400, "m")
	produceLines(t, c.broker, "lines", lines)
	id := c.submitWordcount(t, "100ms")
	waitCounted(t, c.broker, "counts", wordcount.Expected(lines))

	// The checkpoint counter moves between two scrapes.
	first, ok := jobValue(scrape(t, jm+"/metrics"), "weir_job_numberOfCompletedCheckpoints", id)
	if !ok || first < 1 {
		t.Fatalf("numberOfCompletedCheckpoints of job %s: %v (present %v), want at least 1", id, first, ok)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		fams := scrape(t, jm+"/metrics")
		if n, _ := jobValue(fams, "weir_job_numberOfCompletedCheckpoints", id); n > first {
			for _, name := range []string{"weir_job_lastCheckpointDuration", "weir_job_lastCheckpointSize",
				"weir_job_numberOfFailedCheckpoints", "weir_job_numberOfInProgressCheckpoints", "weir_job_numRestarts"} {
				if _, ok := jobValue(fams, name, id); !ok {
					t.Errorf("job manager /metrics has no %s for the job", name)
				}
			}
			if v, _ := jobValue(fams, "weir_job_lastCheckpointSize", id); v <= 0 {
				t.Errorf("lastCheckpointSize %v, want > 0 (wordcount keeps counts)", v)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("numberOfCompletedCheckpoints stayed at %v for 20s", first)
		}
	}

	// Every task of the job on the task managers' /metrics: the sources
	// took in every line, the sinks wrote a count per word.
	words := 0
	for _, n := range wordcount.Expected(lines) {
		words += n
	}
	st := c.status(t, id)
	for deadline := time.Now().Add(20 * time.Second); st.Restarts == 0; time.Sleep(100 * time.Millisecond) {
		fams := scrape(t, tmMetrics)
		tasks := map[string]bool{}
		var sourceIn, sinkOut float64
		for _, s := range samples(fams, "weir_task_numRecordsIn_total") {
			if s.labels["job_id"] == id {
				tasks[s.labels["task_id"]] = true
				if strings.HasPrefix(s.labels["task_name"], "lines") {
					sourceIn += s.value
				}
			}
		}
		for _, s := range samples(fams, "weir_task_numRecordsOut_total") {
			if s.labels["job_id"] == id && strings.HasSuffix(s.labels["task_name"], "-> counts") {
				sinkOut += s.value
			}
		}
		if len(tasks) >= 4 && sourceIn == float64(len(lines)) && sinkOut == float64(words) {
			if samples(fams, "weir_task_backPressuredTimeMs_total") == nil {
				t.Error("no weir_task_backPressuredTimeMs_total")
			}
			if v, ok := jobValue(fams, "weir_sharegroup_heldRecordsLimit", id); !ok || v <= 0 {
				t.Errorf("weir_sharegroup_heldRecordsLimit %v (present %v), want the broker's cap", v, ok)
			}
			if _, ok := jobValue(fams, "weir_pendingTransactions", id); !ok {
				t.Error("no weir_pendingTransactions for the job's transactional operators")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("task metrics: tasks %v, source records in %v (want %d), sink records out %v (want %d)",
				tasks, sourceIn, len(lines), sinkOut, words)
		}
		st = c.status(t, id)
	}

	// REST: the job, its graph and its tasks.
	var jobs struct {
		Jobs []struct{ ID, Status string } `json:"jobs"`
	}
	getJSON(t, jm+"/jobs", &jobs)
	if len(jobs.Jobs) != 1 || jobs.Jobs[0].ID != id || jobs.Jobs[0].Status != "RUNNING" {
		t.Errorf("GET /jobs: %+v, want the job RUNNING", jobs)
	}
	var job restJob
	getJSON(t, jm+"/jobs/"+id, &job)
	if job.ID != id || job.Name != "wordcount" || job.State != "RUNNING" || job.Start == 0 || len(job.Vertices) < 2 {
		t.Fatalf("GET /jobs/%s: %+v", id, job)
	}
	tms := map[string]bool{}
	for _, v := range job.Vertices {
		if v.Parallelism != 2 || len(v.Subtasks) != 2 || v.Status != "RUNNING" {
			t.Errorf("vertex %+v: want parallelism 2, two subtasks, RUNNING", v)
		}
		for _, s := range v.Subtasks {
			if s.TaskManager == "" || s.TaskID == "" {
				t.Errorf("vertex %s: subtask %+v without its task manager", v.Name, s)
			}
			// A running subtask started when it was deployed, after the
			// job was submitted, and has not ended.
			if s.Start < job.Start || s.Start > time.Now().UnixMilli() || s.End != -1 || s.Duration < 0 {
				t.Errorf("vertex %s: subtask %s start-time %d, end-time %d, duration %d; want its deployment's time (job started %d), -1, its age",
					v.Name, s.TaskID, s.Start, s.End, s.Duration, job.Start)
			}
			tms[s.TaskManager] = true
		}
	}
	if len(tms) != 2 {
		t.Errorf("tasks run on %v, want both task managers", tms)
	}
	if len(job.Plan.Nodes) != len(job.Vertices) || len(job.Plan.Nodes[1].Inputs) != 1 || job.Plan.Nodes[1].Inputs[0].Ship != "HASH" {
		t.Errorf("plan %+v: want the vertices, the counter's input by HASH", job.Plan)
	}
	var tml struct {
		TaskManagers []struct {
			ID        string `json:"id"`
			Slots     int    `json:"slotsNumber"`
			FreeSlots int    `json:"freeSlots"`
		} `json:"taskmanagers"`
	}
	getJSON(t, jm+"/taskmanagers", &tml)
	if tms := tml.TaskManagers; len(tms) != 2 || tms[0].Slots != 2 || tms[0].FreeSlots != 1 {
		t.Errorf("GET /taskmanagers: %+v, want two of 2 slots, 1 free each", tml)
	}

	// Errors: an unknown job, a wrong method.
	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{http.MethodGet, "/jobs/0123456789abcdef0123456789abcdef", http.StatusNotFound},
		{http.MethodGet, "/jobs/0123456789abcdef0123456789abcdef/checkpoints", http.StatusNotFound},
		{http.MethodPost, "/jobs/0123456789abcdef0123456789abcdef/cancel", http.StatusNotFound},
		{http.MethodDelete, "/jobs/" + id, http.StatusMethodNotAllowed},
		{http.MethodPost, "/jobs", http.StatusMethodNotAllowed},
		{http.MethodPatch, "/jobs/" + id + "?mode=stop", http.StatusBadRequest},
	} {
		code, body := httpDo(t, tc.method, jm+tc.path)
		if code != tc.code {
			t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, code, body, tc.code)
		}
		if tc.code == http.StatusNotFound {
			var e struct{ Errors []string }
			if err := json.Unmarshal(body, &e); err != nil || len(e.Errors) != 1 {
				t.Errorf("%s %s: body %s, want {\"errors\":[...]}", tc.method, tc.path, body)
			}
		}
	}

	// Cancel by POST answers the final status; the checkpoints then agree
	// with it.
	code, body := httpDo(t, http.MethodPost, jm+"/jobs/"+id+"/cancel")
	var canceled restJob
	if err := json.Unmarshal(body, &canceled); code != http.StatusOK || err != nil || canceled.State != "CANCELED" {
		t.Fatalf("POST /jobs/%s/cancel: %d %s (%v), want 200 CANCELED", id, code, body, err)
	}
	var cps restCheckpoints
	getJSON(t, jm+"/jobs/"+id+"/checkpoints", &cps)
	if len(cps.History) == 0 || cps.Counts.Completed < 2 || cps.Latest.Completed == nil ||
		cps.Latest.Completed.ID != canceled.Last || cps.Latest.Completed.StateSize <= 0 || cps.Counts.InProgress != 0 ||
		cps.Counts.Total != cps.Counts.Completed+cps.Counts.Failed {
		t.Errorf("GET /jobs/%s/checkpoints: %+v, want history, the latest completed checkpoint %d", id, cps, canceled.Last)
	}
	for _, h := range cps.History {
		if h.Status == "COMPLETED" && (h.Trigger == 0 || h.Duration < 0) {
			t.Errorf("history entry %+v", h)
		}
	}
	if c.status(t, id).LastCompletedCheckpoint != canceled.Last {
		t.Errorf("cancel answered last completed checkpoint %d; status says otherwise", canceled.Last)
	}
}
