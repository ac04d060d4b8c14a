package cli

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The types below mirror the fields of Flink's REST API (its
// rest_v1_dispatcher specification and the *Info classes of flink-runtime's
// rest.messages package): a field is Flink's name, its Go type the JSON
// type Flink serves. requireShape checks that Weir serves every one of them
// with that type; Weir may add its own fields.

type flinkIOMetrics struct {
	ReadBytes            int64   `json:"read-bytes"`
	ReadBytesComplete    bool    `json:"read-bytes-complete"`
	WriteBytes           int64   `json:"write-bytes"`
	WriteBytesComplete   bool    `json:"write-bytes-complete"`
	ReadRecords          int64   `json:"read-records"`
	ReadRecordsComplete  bool    `json:"read-records-complete"`
	WriteRecords         int64   `json:"write-records"`
	WriteRecordsComplete bool    `json:"write-records-complete"`
	BackPressured        int64   `json:"accumulated-backpressured-time"`
	Idle                 int64   `json:"accumulated-idle-time"`
	Busy                 float64 `json:"accumulated-busy-time"`
}

type flinkStatsSummary struct {
	Min  int64   `json:"min"`
	Max  int64   `json:"max"`
	Avg  int64   `json:"avg"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P95  float64 `json:"p95"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
}

type flinkTaskCheckpoint struct {
	ID                 int64  `json:"id"`
	Status             string `json:"status"`
	LatestAck          int64  `json:"latest_ack_timestamp"`
	CheckpointedSize   int64  `json:"checkpointed_size"`
	StateSize          int64  `json:"state_size"`
	EndToEndDuration   int64  `json:"end_to_end_duration"`
	AlignmentBuffered  int64  `json:"alignment_buffered"`
	ProcessedData      int64  `json:"processed_data"`
	PersistedData      int64  `json:"persisted_data"`
	NumSubtasks        int    `json:"num_subtasks"`
	NumAcknowledged    int    `json:"num_acknowledged_subtasks"`
	AlignmentDurationW int64  `json:"alignment_duration"` // Weir's
	SyncDurationW      int64  `json:"sync_duration"`      // Weir's
	AsyncDurationW     int64  `json:"async_duration"`     // Weir's
}

// flinkSubtaskCheckpoint is Flink's SubtaskCheckpointStatistics of an
// acknowledged subtask.
type flinkSubtaskCheckpoint struct {
	Index            int    `json:"index"`
	Status           string `json:"status"`
	AckTimestamp     int64  `json:"ack_timestamp"`
	EndToEndDuration int64  `json:"end_to_end_duration"`
	StateSize        int64  `json:"state_size"`
	CheckpointedSize int64  `json:"checkpointed_size"`
	Checkpoint       struct {
		Sync  int64 `json:"sync"`
		Async int64 `json:"async"`
	} `json:"checkpoint"`
	Alignment struct {
		Buffered  int64 `json:"buffered"`
		Processed int64 `json:"processed"`
		Persisted int64 `json:"persisted"`
		Duration  int64 `json:"duration"`
	} `json:"alignment"`
	StartDelay          int64 `json:"start_delay"`
	UnalignedCheckpoint bool  `json:"unaligned_checkpoint"`
	Aborted             bool  `json:"aborted"`
}

// flinkSubtasksCheckpoint is Flink's
// TaskCheckpointStatisticsWithSubtaskDetails.
type flinkSubtasksCheckpoint struct {
	flinkTaskCheckpoint
	Summary struct {
		CheckpointedSize   flinkStatsSummary `json:"checkpointed_size"`
		StateSize          flinkStatsSummary `json:"state_size"`
		EndToEndDuration   flinkStatsSummary `json:"end_to_end_duration"`
		CheckpointDuration struct {
			Sync  flinkStatsSummary `json:"sync"`
			Async flinkStatsSummary `json:"async"`
		} `json:"checkpoint_duration"`
		Alignment struct {
			Buffered  flinkStatsSummary `json:"buffered"`
			Processed flinkStatsSummary `json:"processed"`
			Persisted flinkStatsSummary `json:"persisted"`
			Duration  flinkStatsSummary `json:"duration"`
		} `json:"alignment"`
		StartDelay          flinkStatsSummary `json:"start_delay"`
		UnalignedCheckpoint flinkStatsSummary `json:"unaligned_checkpoint"`
	} `json:"summary"`
	Subtasks []flinkSubtaskCheckpoint `json:"subtasks"`
}

type flinkCheckpoint struct {
	ClassName         string                         `json:"className"`
	ID                int64                          `json:"id"`
	Status            string                         `json:"status"`
	IsSavepoint       bool                           `json:"is_savepoint"`
	Trigger           int64                          `json:"trigger_timestamp"`
	LatestAck         int64                          `json:"latest_ack_timestamp"`
	CheckpointedSize  int64                          `json:"checkpointed_size"`
	StateSize         int64                          `json:"state_size"`
	EndToEndDuration  int64                          `json:"end_to_end_duration"`
	AlignmentBuffered int64                          `json:"alignment_buffered"`
	ProcessedData     int64                          `json:"processed_data"`
	PersistedData     int64                          `json:"persisted_data"`
	NumSubtasks       int                            `json:"num_subtasks"`
	NumAcknowledged   int                            `json:"num_acknowledged_subtasks"`
	CheckpointType    string                         `json:"checkpoint_type"`
	Tasks             map[string]flinkTaskCheckpoint `json:"tasks"`
	// Completed checkpoints only.
	ExternalPath string `json:"external_path,omitempty"`
	Discarded    *bool  `json:"discarded,omitempty"`
}

type flinkCheckpoints struct {
	Counts struct {
		Restored   int64 `json:"restored"`
		Total      int64 `json:"total"`
		InProgress int   `json:"in_progress"`
		Completed  int64 `json:"completed"`
		Failed     int64 `json:"failed"`
	} `json:"counts"`
	Summary struct {
		CheckpointedSize  flinkStatsSummary `json:"checkpointed_size"`
		StateSize         flinkStatsSummary `json:"state_size"`
		EndToEndDuration  flinkStatsSummary `json:"end_to_end_duration"`
		AlignmentBuffered flinkStatsSummary `json:"alignment_buffered"`
		ProcessedData     flinkStatsSummary `json:"processed_data"`
		PersistedData     flinkStatsSummary `json:"persisted_data"`
	} `json:"summary"`
	Latest struct {
		Completed *flinkCheckpoint `json:"completed"`
		Savepoint *flinkCheckpoint `json:"savepoint"`
		Failed    *flinkCheckpoint `json:"failed"`
		Restored  *struct {
			ID           int64  `json:"id"`
			Restore      int64  `json:"restore_timestamp"`
			IsSavepoint  bool   `json:"is_savepoint"`
			ExternalPath string `json:"external_path"`
		} `json:"restored"`
	} `json:"latest"`
	History []flinkCheckpoint `json:"history"`
}

type flinkSubtask struct {
	Subtask     int            `json:"subtask"`
	Status      string         `json:"status"`
	Attempt     int            `json:"attempt"`
	Host        string         `json:"host"`
	Endpoint    string         `json:"endpoint"`
	Start       int64          `json:"start-time"`
	End         int64          `json:"end-time"`
	Duration    int64          `json:"duration"`
	Metrics     flinkIOMetrics `json:"metrics"`
	TaskManager string         `json:"taskmanager-id"`
}

type flinkJobVertex struct {
	ID             string         `json:"id"`
	Name           string         `json:"name"`
	MaxParallelism int            `json:"maxParallelism"`
	Parallelism    int            `json:"parallelism"`
	Status         string         `json:"status"`
	Start          int64          `json:"start-time"`
	End            int64          `json:"end-time"`
	Duration       int64          `json:"duration"`
	Tasks          map[string]int `json:"tasks"`
	Metrics        flinkIOMetrics `json:"metrics"`
}

type flinkPlan struct {
	ID    string `json:"jid"`
	Name  string `json:"name"`
	Nodes []struct {
		ID               string `json:"id"`
		Parallelism      int    `json:"parallelism"`
		Operator         string `json:"operator"`
		OperatorStrategy string `json:"operator_strategy"`
		Description      string `json:"description"`
		Inputs           []struct {
			Num          int    `json:"num"`
			ID           string `json:"id"`
			ShipStrategy string `json:"ship_strategy"`
			Exchange     string `json:"exchange"`
		} `json:"inputs,omitempty"` // Flink omits a source's
		OptimizerProperties map[string]any `json:"optimizer_properties"`
	} `json:"nodes"`
}

type flinkJobDetails struct {
	ID             string           `json:"jid"`
	Name           string           `json:"name"`
	IsStoppable    bool             `json:"isStoppable"`
	State          string           `json:"state"`
	Start          int64            `json:"start-time"`
	End            int64            `json:"end-time"`
	Duration       int64            `json:"duration"`
	MaxParallelism int64            `json:"maxParallelism"`
	Now            int64            `json:"now"`
	Timestamps     map[string]int64 `json:"timestamps"`
	Vertices       []flinkJobVertex `json:"vertices"`
	StatusCounts   map[string]int   `json:"status-counts"`
	Plan           flinkPlan        `json:"plan"`
}

type flinkResource struct {
	CPUCores          float64            `json:"cpuCores"`
	TaskHeapMemory    int                `json:"taskHeapMemory"`
	TaskOffHeapMemory int                `json:"taskOffHeapMemory"`
	ManagedMemory     int                `json:"managedMemory"`
	NetworkMemory     int                `json:"networkMemory"`
	ExtendedResources map[string]float64 `json:"extendedResources"`
}

type flinkTaskManagers struct {
	TaskManagers []struct {
		ID                     string        `json:"id"`
		Path                   string        `json:"path"`
		DataPort               int           `json:"dataPort"`
		JmxPort                int           `json:"jmxPort"`
		TimeSinceLastHeartbeat int64         `json:"timeSinceLastHeartbeat"`
		SlotsNumber            int           `json:"slotsNumber"`
		FreeSlots              int           `json:"freeSlots"`
		TotalResource          flinkResource `json:"totalResource"`
		FreeResource           flinkResource `json:"freeResource"`
		Hardware               struct {
			CPUCores       int   `json:"cpuCores"`
			PhysicalMemory int64 `json:"physicalMemory"`
			FreeMemory     int64 `json:"freeMemory"`
			ManagedMemory  int64 `json:"managedMemory"`
		} `json:"hardware"`
		MemoryConfiguration map[string]int64 `json:"memoryConfiguration"`
	} `json:"taskmanagers"`
}

type flinkOverview struct {
	TaskManagers   int    `json:"taskmanagers"`
	SlotsTotal     int    `json:"slots-total"`
	SlotsAvailable int    `json:"slots-available"`
	JobsRunning    int    `json:"jobs-running"`
	JobsFinished   int    `json:"jobs-finished"`
	JobsCancelled  int    `json:"jobs-cancelled"`
	JobsFailed     int    `json:"jobs-failed"`
	Version        string `json:"flink-version"`
	Commit         string `json:"flink-commit"`
}

type flinkDashboardConfig struct {
	RefreshInterval int64  `json:"refresh-interval"`
	TimezoneName    string `json:"timezone-name"`
	TimezoneOffset  int    `json:"timezone-offset"`
	Version         string `json:"flink-version"`
	Revision        string `json:"flink-revision"`
	Features        struct {
		WebSubmit bool `json:"web-submit"`
		WebCancel bool `json:"web-cancel"`
	} `json:"features"`
}

type flinkJobsOverview struct {
	Jobs []struct {
		ID               string         `json:"jid"`
		Name             string         `json:"name"`
		Start            int64          `json:"start-time"`
		End              int64          `json:"end-time"`
		Duration         int64          `json:"duration"`
		State            string         `json:"state"`
		LastModification int64          `json:"last-modification"`
		Tasks            map[string]int `json:"tasks"`
	} `json:"jobs"`
}

type flinkJobConfig struct {
	ID              string `json:"jid"`
	Name            string `json:"name"`
	ExecutionConfig struct {
		ExecutionMode   string            `json:"execution-mode"`
		RestartStrategy string            `json:"restart-strategy"`
		JobParallelism  int               `json:"job-parallelism"`
		ObjectReuseMode bool              `json:"object-reuse-mode"`
		UserConfig      map[string]string `json:"user-config"`
	} `json:"execution-config"`
}

type flinkVertexDetails struct {
	ID             string         `json:"id"`
	Name           string         `json:"name"`
	MaxParallelism int            `json:"maxParallelism"`
	Parallelism    int            `json:"parallelism"`
	Now            int64          `json:"now"`
	Subtasks       []flinkSubtask `json:"subtasks"`
}

// flinkMetric is an entry of Flink's MetricCollectionResponseBody (the
// watermarks route serves a list of them).
type flinkMetric struct {
	ID    string `json:"id"`
	Value string `json:"value"`
}

type flinkBackPressure struct {
	Status   string `json:"status"`
	Level    string `json:"backpressure-level"`
	End      int64  `json:"end-timestamp"`
	Subtasks []struct {
		Subtask   int     `json:"subtask"`
		Level     string  `json:"backpressure-level"`
		Ratio     float64 `json:"ratio"`
		IdleRatio float64 `json:"idleRatio"`
		BusyRatio float64 `json:"busyRatio"`
	} `json:"subtasks"`
}

type flinkCheckpointConfig struct {
	Mode            string `json:"mode"`
	Interval        int64  `json:"interval"`
	Timeout         int64  `json:"timeout"`
	MinPause        int64  `json:"min_pause"`
	MaxConcurrent   int64  `json:"max_concurrent"`
	Externalization struct {
		Enabled              bool `json:"enabled"`
		DeleteOnCancellation bool `json:"delete_on_cancellation"`
	} `json:"externalization"`
	StateBackend                string `json:"state_backend"`
	CheckpointStorage           string `json:"checkpoint_storage"`
	UnalignedCheckpoints        bool   `json:"unaligned_checkpoints"`
	TolerableFailedCheckpoints  int    `json:"tolerable_failed_checkpoints"`
	AlignedCheckpointTimeout    int64  `json:"aligned_checkpoint_timeout"`
	CheckpointsAfterTasksFinish bool   `json:"checkpoints_after_tasks_finish"`
}

type flinkErrorBody struct {
	Errors []string `json:"errors"`
}

// requireShape reports every field of typ (Flink's, by its json tag) that
// doc lacks or holds with another JSON type, at path. A field tagged
// omitempty may be absent; a pointer may be null.
func requireShape(t *testing.T, path string, doc any, typ reflect.Type) {
	t.Helper()
	want := func(kind string, ok bool) {
		t.Helper()
		if !ok {
			t.Errorf("%s: %s (%T), want %s", path, trunc(doc), doc, kind)
		}
	}
	switch typ.Kind() {
	case reflect.Pointer:
		if doc != nil {
			requireShape(t, path, doc, typ.Elem())
		}
	case reflect.Struct:
		m, ok := doc.(map[string]any)
		want("an object", ok)
		if !ok {
			return
		}
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				continue
			}
			v, present := m[name]
			if !present {
				if opts != "omitempty" {
					t.Errorf("%s: no field %q", path, name)
				}
				continue
			}
			requireShape(t, path+"."+name, v, f.Type)
		}
	case reflect.Map:
		m, ok := doc.(map[string]any)
		want("an object", ok)
		for k, v := range m {
			requireShape(t, path+"["+k+"]", v, typ.Elem())
		}
	case reflect.Slice:
		a, ok := doc.([]any)
		want("an array", ok)
		for i, v := range a {
			requireShape(t, fmt.Sprintf("%s[%d]", path, i), v, typ.Elem())
		}
	case reflect.String:
		_, ok := doc.(string)
		want("a string", ok)
	case reflect.Bool:
		_, ok := doc.(bool)
		want("a boolean", ok)
	case reflect.Int, reflect.Int32, reflect.Int64:
		n, ok := doc.(float64)
		want("an integer", ok && n == math.Trunc(n))
	case reflect.Float64:
		_, ok := doc.(float64)
		want("a number", ok)
	case reflect.Interface:
		want("a value", doc != nil)
	default:
		t.Fatalf("%s: requireShape cannot check a %v", path, typ)
	}
}

// waitTaskManagers waits (30 s) until the job manager at jm lists n
// registered task managers.
func waitTaskManagers(t *testing.T, jm string, n int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var l struct {
			TaskManagers []struct {
				State string `json:"state"`
			} `json:"taskmanagers"`
		}
		getJSON(t, jm+"/taskmanagers", &l)
		registered := 0
		for _, tm := range l.TaskManagers {
			if tm.State == "REGISTERED" {
				registered++
			}
		}
		if registered == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d task managers registered after 30s, want %d", registered, n)
		}
	}
}

func trunc(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}

// While wordcount runs on a local cluster, every endpoint Weir serves in
// Flink's shape serves every field of Flink's with its JSON type (a tool
// written for Flink's REST API reads it), errors are Flink's
// {"errors": [...]} with Flink's status codes, and PATCH ?mode=cancel
// answers 202 at once, as Flink's does, and the job then ends CANCELED.
func TestRESTServesFlinksShapesForEveryEndpoint(t *testing.T) {
	c := startLocal(t, "--taskmanagers", "2", "--slots", "2")
	jm := "http://" + c.addr(t, "jobmanager http on")
	produceLines(t, c.broker, "lines", testLines(300, "f"))
	waitTaskManagers(t, jm, 2)
	id := c.submitWordcount(t, "100ms")
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if st := c.status(t, id); st.State == "RUNNING" && st.LastCompletedCheckpoint >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s did not complete 3 checkpoints in 60s: %+v", id, c.status(t, id))
		}
	}
	var job flinkJobDetails
	getJSON(t, jm+"/jobs/"+id, &job)
	if len(job.Vertices) < 2 {
		t.Fatalf("GET /jobs/%s: %+v, want the wordcount's vertices", id, job)
	}
	vid := job.Vertices[0].ID
	var cps flinkCheckpoints
	getJSON(t, jm+"/jobs/"+id+"/checkpoints", &cps)
	if cps.Latest.Completed == nil {
		t.Fatalf("GET /jobs/%s/checkpoints: no latest completed checkpoint: %+v", id, cps)
	}
	cid := cps.Latest.Completed.ID

	for _, tc := range []struct {
		path string
		code int
		typ  any
	}{
		{"/overview", http.StatusOK, flinkOverview{}},
		{"/config", http.StatusOK, flinkDashboardConfig{}},
		{"/jobs", http.StatusOK, struct {
			Jobs []struct {
				ID     string `json:"id"`
				Status string `json:"status"`
			} `json:"jobs"`
		}{}},
		{"/jobs/overview", http.StatusOK, flinkJobsOverview{}},
		{"/jobs/" + id, http.StatusOK, flinkJobDetails{}},
		{"/jobs/" + id + "/config", http.StatusOK, flinkJobConfig{}},
		{"/jobs/" + id + "/plan", http.StatusOK, struct {
			Plan flinkPlan `json:"plan"`
		}{}},
		{"/jobs/" + id + "/vertices/" + vid, http.StatusOK, flinkVertexDetails{}},
		{"/jobs/" + id + "/vertices/" + vid + "/backpressure", http.StatusOK, flinkBackPressure{}},
		{"/jobs/" + id + "/vertices/" + vid + "/watermarks", http.StatusOK, []flinkMetric{}},
		{"/jobs/" + id + "/checkpoints", http.StatusOK, flinkCheckpoints{}},
		{"/jobs/" + id + "/checkpoints/config", http.StatusOK, flinkCheckpointConfig{}},
		{fmt.Sprintf("/jobs/%s/checkpoints/details/%d", id, cid), http.StatusOK, flinkCheckpoint{}},
		{fmt.Sprintf("/jobs/%s/checkpoints/details/%d/subtasks/%s", id, cid, vid), http.StatusOK, flinkSubtasksCheckpoint{}},
		{"/taskmanagers", http.StatusOK, flinkTaskManagers{}},
		{"/jobs/nosuchjob", http.StatusNotFound, flinkErrorBody{}},
		{"/jobs/nosuchjob/checkpoints", http.StatusNotFound, flinkErrorBody{}},
		{"/jobs/" + id + "/vertices/nosuchvertex", http.StatusNotFound, flinkErrorBody{}},
		{"/jobs/" + id + "/checkpoints/details/999999", http.StatusNotFound, flinkErrorBody{}},
		{"/jobs/" + id + "/checkpoints/details/x", http.StatusBadRequest, flinkErrorBody{}},
		{fmt.Sprintf("/jobs/%s/checkpoints/details/%d/subtasks/nosuchvertex", id, cid), http.StatusNotFound, flinkErrorBody{}},
		{"/no/such/route", http.StatusNotFound, flinkErrorBody{}},
	} {
		t.Run(strings.ReplaceAll(tc.path, "/", "_"), func(t *testing.T) {
			code, body := httpDo(t, http.MethodGet, jm+tc.path)
			if code != tc.code {
				t.Fatalf("GET %s: %d %s, want %d", tc.path, code, body, tc.code)
			}
			var doc any
			if err := json.Unmarshal(body, &doc); err != nil {
				t.Fatalf("GET %s: %v: %s", tc.path, err, body)
			}
			requireShape(t, "GET "+tc.path, doc, reflect.TypeOf(tc.typ))
		})
	}

	// Values a Flink tool reads, beyond their types.
	var ov flinkJobsOverview
	getJSON(t, jm+"/jobs/overview", &ov)
	subtasks := 0
	for _, v := range job.Vertices {
		subtasks += v.Parallelism
	}
	if len(ov.Jobs) != 1 || ov.Jobs[0].Tasks["total"] != subtasks || ov.Jobs[0].Tasks["running"] != subtasks ||
		ov.Jobs[0].LastModification < ov.Jobs[0].Start {
		t.Errorf("GET /jobs/overview: %+v, want %d tasks, all running, last-modification after start-time", ov, subtasks)
	}
	for _, v := range job.Vertices {
		// A subtask's watermark is known from its task manager's first
		// statistics report, which a quiet machine's three checkpoints at
		// 100 ms can precede.
		var wms []flinkMetric
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			wms = nil
			getJSON(t, jm+"/jobs/"+id+"/vertices/"+v.ID+"/watermarks", &wms)
			if len(wms) == v.Parallelism || time.Now().After(deadline) {
				break
			}
		}
		if len(wms) != v.Parallelism {
			t.Errorf("GET watermarks of vertex %s: %+v, want one per subtask of %d", v.ID, wms, v.Parallelism)
		}
		for i, m := range wms {
			if _, err := strconv.ParseInt(m.Value, 10, 64); m.ID != fmt.Sprintf("%d.currentInputWatermark", i) || err != nil {
				t.Errorf("GET watermarks of vertex %s: %+v, want %d.currentInputWatermark with an integer value", v.ID, m, i)
			}
		}
	}
	var tms flinkTaskManagers
	getJSON(t, jm+"/taskmanagers", &tms)
	if len(tms.TaskManagers) != 2 || tms.TaskManagers[0].SlotsNumber != 2 {
		t.Errorf("GET /taskmanagers: %+v, want two task managers of 2 slots", tms)
	}
	var details flinkCheckpoint
	getJSON(t, fmt.Sprintf("%s/jobs/%s/checkpoints/details/%d", jm, id, cid), &details)
	acked := 0
	for _, tc := range details.Tasks {
		acked += tc.NumAcknowledged
	}
	if details.Status != "COMPLETED" || details.ClassName != "completed" || details.NumSubtasks != subtasks ||
		details.NumAcknowledged != subtasks || len(details.Tasks) != len(job.Vertices) || acked != subtasks {
		t.Errorf("checkpoint %d: %+v, want COMPLETED with %d of %d subtasks acknowledged over %d vertices",
			cid, details, subtasks, subtasks, len(job.Vertices))
	}
	getJSON(t, jm+"/jobs/"+id+"/checkpoints", &cps)
	if len(cps.History) < 3 || len(cps.History) > 10 || cps.Summary.EndToEndDuration.Max < cps.Summary.EndToEndDuration.Min ||
		cps.Summary.EndToEndDuration.Max == 0 || cps.Counts.Completed < 3 || cps.Counts.Total < cps.Counts.Completed {
		t.Errorf("GET /jobs/%s/checkpoints: %+v, want at most the last 10 checkpoints and a summary", id, cps)
	}
	var long flinkCheckpoints
	getJSON(t, jm+"/jobs/"+id+"/checkpoints?history=1000", &long)
	if int64(len(long.History)) < long.Counts.Completed {
		t.Errorf("GET /jobs/%s/checkpoints?history=1000: %d checkpoints, want every one of %d", id, len(long.History), long.Counts.Completed)
	}

	// Errors and cancel: a bad mode is 400, a method a route does not serve
	// 405; PATCH ?mode=cancel is 202 at once, then the job is CANCELED.
	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{http.MethodPatch, "/jobs/" + id + "?mode=stop", http.StatusBadRequest},
		{http.MethodDelete, "/jobs/" + id, http.StatusMethodNotAllowed},
		{http.MethodPatch, "/jobs/nosuchjob?mode=cancel", http.StatusNotFound},
	} {
		code, body := httpDo(t, tc.method, jm+tc.path)
		var e flinkErrorBody
		if err := json.Unmarshal(body, &e); code != tc.code || err != nil || len(e.Errors) != 1 {
			t.Errorf("%s %s: %d %s, want %d with {\"errors\":[...]}", tc.method, tc.path, code, body, tc.code)
		}
	}
	code, body := httpDo(t, http.MethodPatch, jm+"/jobs/"+id+"?mode=cancel")
	if code != http.StatusAccepted || strings.TrimSpace(string(body)) != "{}" {
		t.Fatalf("PATCH /jobs/%s?mode=cancel: %d %s, want 202 {}", id, code, body)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		getJSON(t, jm+"/jobs/"+id, &job)
		if job.State == "CANCELED" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s is %s 60s after PATCH ?mode=cancel", id, job.State)
		}
	}
	// A cancelled job keeps its final metrics: its records and its tasks'.
	var ended restJob
	getJSON(t, jm+"/jobs/"+id, &ended)
	for _, v := range ended.Vertices {
		if v.Metrics.Read == 0 || v.Metrics.Write == 0 {
			t.Errorf("cancelled job's vertex %s shows %d records in, %d out: its final metrics are lost", v.Name, v.Metrics.Read, v.Metrics.Write)
		}
	}
	if code, body := httpDo(t, http.MethodPatch, jm+"/jobs/"+id+"?mode=cancel"); code != http.StatusAccepted {
		t.Errorf("PATCH ?mode=cancel of a cancelled job: %d %s, want 202", code, body)
	}
}

// On a running cluster (task managers acknowledging over the control
// plane), every acknowledged subtask of a completed checkpoint shows its
// synchronous and asynchronous snapshot durations per vertex in GET
// .../checkpoints/details/{cid}/subtasks/{vid}: non-negative, and with the
// alignment no longer than the subtask's end-to-end duration.
func TestRESTShowsEveryAcknowledgedSubtasksSyncAndAsyncDurations(t *testing.T) {
	c := startLocal(t, "--taskmanagers", "2", "--slots", "2")
	jm := "http://" + c.addr(t, "jobmanager http on")
	produceLines(t, c.broker, "lines", testLines(300, "s"))
	waitTaskManagers(t, jm, 2)
	id := c.submitWordcount(t, "100ms")
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if st := c.status(t, id); st.State == "RUNNING" && st.LastCompletedCheckpoint >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s did not complete 3 checkpoints in 60s: %+v", id, c.status(t, id))
		}
	}
	var job flinkJobDetails
	getJSON(t, jm+"/jobs/"+id, &job)
	var cps flinkCheckpoints
	getJSON(t, jm+"/jobs/"+id+"/checkpoints", &cps)
	if cps.Latest.Completed == nil {
		t.Fatalf("GET /jobs/%s/checkpoints: no latest completed checkpoint: %+v", id, cps)
	}
	cid := cps.Latest.Completed.ID
	for _, v := range job.Vertices {
		var sub flinkSubtasksCheckpoint
		getJSON(t, fmt.Sprintf("%s/jobs/%s/checkpoints/details/%d/subtasks/%s", jm, id, cid, v.ID), &sub)
		if len(sub.Subtasks) != v.Parallelism || sub.NumAcknowledged != v.Parallelism || sub.Status != "COMPLETED" {
			t.Fatalf("vertex %s, checkpoint %d: %+v, want %d acknowledged subtasks", v.ID, cid, sub, v.Parallelism)
		}
		var maxSync, maxAsync int64
		for i, s := range sub.Subtasks {
			cp, al := s.Checkpoint, s.Alignment.Duration
			if s.Index != i || s.Status != "completed" || s.AckTimestamp < cps.Latest.Completed.Trigger {
				t.Errorf("vertex %s subtask %d: %+v, want index %d, completed, acknowledged after the trigger", v.ID, i, s, i)
			}
			if cp.Sync < 0 || cp.Async < 0 || al < 0 || cp.Sync+cp.Async+al > s.EndToEndDuration {
				t.Errorf("vertex %s subtask %d: sync %d ms, async %d ms, alignment %d ms, end to end %d ms: want non-negative parts within end to end",
					v.ID, i, cp.Sync, cp.Async, al, s.EndToEndDuration)
			}
			maxSync, maxAsync = max(maxSync, cp.Sync), max(maxAsync, cp.Async)
		}
		if sub.SyncDurationW != maxSync || sub.AsyncDurationW != maxAsync ||
			sub.Summary.CheckpointDuration.Sync.Max != maxSync || sub.Summary.CheckpointDuration.Async.Max != maxAsync {
			t.Errorf("vertex %s: sync_duration %d, async_duration %d, summary %+v: want the subtasks' longest, %d and %d ms",
				v.ID, sub.SyncDurationW, sub.AsyncDurationW, sub.Summary.CheckpointDuration, maxSync, maxAsync)
		}
	}

	// streamctl checkpoints shows the longest sync and async part of each
	// retained checkpoint this job manager saw acknowledged.
	out, err := c.cli(t, "checkpoints", id, "--output", "json")
	if err != nil {
		t.Fatalf("streamctl checkpoints: %v", err)
	}
	var listed []struct {
		ID      uint64 `json:"id"`
		SyncMs  *int64 `json:"sync_ms"`
		AsyncMs *int64 `json:"async_ms"`
	}
	if err := json.Unmarshal([]byte(out), &listed); err != nil || len(listed) == 0 {
		t.Fatalf("streamctl checkpoints --output json: %v: %s", err, out)
	}
	for _, l := range listed {
		if l.SyncMs == nil || l.AsyncMs == nil || *l.SyncMs < 0 || *l.AsyncMs < 0 {
			t.Errorf("streamctl checkpoints: checkpoint %d has no sync_ms and async_ms: %s", l.ID, out)
		}
	}
	if out, err := c.cli(t, "checkpoints", id); err != nil ||
		!strings.Contains(strings.Join(strings.Fields(strings.SplitN(out, "\n", 2)[0]), " "), "TASKS SYNC ASYNC ERROR") {
		t.Errorf("streamctl checkpoints: %v: %s, want SYNC and ASYNC columns", err, out)
	}
}
