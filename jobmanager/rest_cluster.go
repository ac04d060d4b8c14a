package jobmanager

import (
	"fmt"
	"math"
	"net/http"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/weirstream/weir/runtime"
)

// Flink's cluster, job-configuration and vertex shapes: GET /overview,
// /config, /taskmanagers, /jobs/{id}/config, /jobs/{id}/plan,
// /jobs/{id}/vertices/{vid} and its /backpressure.

// buildVersion is the job manager binary's module version and VCS
// revision, as `streamctl version` prints them.
func buildVersion() (version, revision string) {
	version = "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		version = bi.Main.Version
		for _, kv := range bi.Settings {
			if kv.Key == "vcs.revision" {
				revision = kv.Value
			}
		}
	}
	return version, revision
}

// clusterOverview is Flink's ClusterOverviewWithVersion; the version is
// Weir's.
type clusterOverview struct {
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

func (s *Server) restClusterOverview(w http.ResponseWriter, r *http.Request) {
	recs, err := s.Jobs(r.Context())
	if err != nil {
		restError(w, err)
		return
	}
	var o clusterOverview
	o.Version, o.Commit = buildVersion()
	for _, t := range s.TaskManagers() {
		o.TaskManagers++
		o.SlotsTotal += t.Slots
		o.SlotsAvailable += t.Slots - t.UsedSlots
	}
	for _, rec := range recs {
		switch rec.State {
		case StateFinished:
			o.JobsFinished++
		case StateCanceled:
			o.JobsCancelled++
		case StateFailed:
			o.JobsFailed++
		default: // Flink counts created and restarting jobs as running
			o.JobsRunning++
		}
	}
	writeJSON(w, http.StatusOK, o)
}

// dashboardConfig is Flink's DashboardConfiguration.
type dashboardConfig struct {
	RefreshInterval int64  `json:"refresh-interval"`
	TimezoneName    string `json:"timezone-name"`
	TimezoneOffset  int    `json:"timezone-offset"`
	Version         string `json:"flink-version"`
	Revision        string `json:"flink-revision"`
	Features        struct {
		WebSubmit  bool `json:"web-submit"`
		WebCancel  bool `json:"web-cancel"`
		WebRescale bool `json:"web-rescale"`
		WebHistory bool `json:"web-history"`
	} `json:"features"`
}

// dashboardRefresh is how often the dashboard refreshes (its app.js
// REFRESH_MS), served as /config's refresh-interval.
const dashboardRefresh = 2 * time.Second

func (s *Server) restDashboardConfig(w http.ResponseWriter, _ *http.Request) {
	var c dashboardConfig
	c.RefreshInterval = dashboardRefresh.Milliseconds()
	now := time.Now()
	name, offset := now.Zone()
	c.TimezoneName, c.TimezoneOffset = name, offset*1000
	c.Version, c.Revision = buildVersion()
	c.Features.WebCancel = true
	writeJSON(w, http.StatusOK, c)
}

// taskManagerInfo is Flink's TaskManagerInfo (resources and hardware are
// not measured: their fields are 0) and Weir's fields, the old names of the
// slots included.
type taskManagerInfo struct {
	ID                     string         `json:"id"`
	Path                   string         `json:"path"`
	DataPort               int            `json:"dataPort"`
	JmxPort                int            `json:"jmxPort"`
	TimeSinceLastHeartbeat int64          `json:"timeSinceLastHeartbeat"`
	SlotsNumber            int            `json:"slotsNumber"`
	FreeSlots              int            `json:"freeSlots"`
	TotalResource          resourceInfo   `json:"totalResource"`
	FreeResource           resourceInfo   `json:"freeResource"`
	Hardware               hardwareInfo   `json:"hardware"`
	MemoryConfiguration    map[string]int `json:"memoryConfiguration"`
	Blocked                bool           `json:"blocked"`

	Slots          int    `json:"slots"`
	FreeSlotsWeir  int    `json:"free_slots"`
	DataHost       string `json:"data_host"`
	Session        uint64 `json:"session"`
	HeartbeatAgeMs int64  `json:"heartbeat_age_ms"`
	State          string `json:"state"`
	LostAt         int64  `json:"lost_at,omitempty"`
	LostReason     string `json:"lost_reason,omitempty"`
}

// resourceInfo is Flink's ResourceProfileInfo.
type resourceInfo struct {
	CPUCores          float64            `json:"cpuCores"`
	TaskHeapMemory    int                `json:"taskHeapMemory"`
	TaskOffHeapMemory int                `json:"taskOffHeapMemory"`
	ManagedMemory     int                `json:"managedMemory"`
	NetworkMemory     int                `json:"networkMemory"`
	ExtendedResources map[string]float64 `json:"extendedResources"`
}

// hardwareInfo is Flink's HardwareDescription.
type hardwareInfo struct {
	CPUCores       int   `json:"cpuCores"`
	PhysicalMemory int64 `json:"physicalMemory"`
	FreeMemory     int64 `json:"freeMemory"`
	ManagedMemory  int64 `json:"managedMemory"`
}

// memoryFields are Flink's TaskExecutorMemoryConfiguration fields.
var memoryFields = [...]string{"frameworkHeap", "taskHeap", "frameworkOffHeap", "taskOffHeap", "networkMemory", "managedMemory",
	"jvmMetaspace", "jvmOverhead", "totalFlinkMemory", "totalProcessMemory"}

func newTaskManagerInfo(t TaskManager, state string) taskManagerInfo {
	free := t.Slots - t.UsedSlots
	i := taskManagerInfo{ID: t.ID, Path: t.ID, TimeSinceLastHeartbeat: time.Now().Add(-t.HeartbeatAge).UnixMilli(),
		SlotsNumber: t.Slots, FreeSlots: free, MemoryConfiguration: map[string]int{},
		TotalResource: resourceInfo{ExtendedResources: map[string]float64{}}, FreeResource: resourceInfo{ExtendedResources: map[string]float64{}},
		Slots: t.Slots, FreeSlotsWeir: free, DataHost: t.DataHost, Session: t.Session, HeartbeatAgeMs: t.HeartbeatAge.Milliseconds(), State: state}
	for _, f := range memoryFields {
		i.MemoryConfiguration[f] = 0
	}
	return i
}

// restTaskManagers is Flink's {"taskmanagers": [...]}: the registered task
// managers (state REGISTERED), then those lost since (state LOST, no free
// slots) until they register again.
func (s *Server) restTaskManagers(w http.ResponseWriter, _ *http.Request) {
	out := struct {
		TaskManagers []taskManagerInfo `json:"taskmanagers"`
	}{TaskManagers: []taskManagerInfo{}}
	for _, t := range s.TaskManagers() {
		out.TaskManagers = append(out.TaskManagers, newTaskManagerInfo(t, "REGISTERED"))
	}
	for _, l := range s.LostTaskManagers() {
		l.UsedSlots = l.Slots
		i := newTaskManagerInfo(l.TaskManager, "LOST")
		i.TimeSinceLastHeartbeat = l.At.Add(-l.HeartbeatAge).UnixMilli()
		i.HeartbeatAgeMs = time.Since(l.At.Add(-l.HeartbeatAge)).Milliseconds()
		i.LostAt, i.LostReason = l.At.UnixMilli(), l.Reason
		out.TaskManagers = append(out.TaskManagers, i)
	}
	writeJSON(w, http.StatusOK, out)
}

// jobConfig is Flink's JobConfigInfo: the job's parameters are its
// user-config.
type jobConfig struct {
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

func (s *Server) restJobConfig(w http.ResponseWriter, r *http.Request) {
	rec, _, err := s.Job(r.Context(), r.PathValue("id"))
	if err != nil {
		restError(w, err)
		return
	}
	c := jobConfig{ID: rec.ID, Name: rec.Type}
	c.ExecutionConfig.ExecutionMode = "PIPELINED"
	c.ExecutionConfig.RestartStrategy = restartStrategyInForce(rec.RestartStrategy)
	c.ExecutionConfig.JobParallelism = 1
	if p, err := strconv.Atoi(rec.Params[runtime.ParamParallelism]); err == nil {
		c.ExecutionConfig.JobParallelism = p
	}
	c.ExecutionConfig.UserConfig = rec.Params
	if c.ExecutionConfig.UserConfig == nil {
		c.ExecutionConfig.UserConfig = map[string]string{}
	}
	writeJSON(w, http.StatusOK, c)
}

// restPlan is Flink's JobPlanInfo: {"plan": the plan of GET /jobs/{id}}.
func (s *Server) restPlan(w http.ResponseWriter, r *http.Request) {
	d, err := s.jobDetails(r.Context(), r.PathValue("id"))
	if err != nil {
		restError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Plan jobPlan `json:"plan"`
	}{d.Plan})
}

// vertex returns vertex vid of job id as GET /jobs/{id} shows it.
func (s *Server) vertex(r *http.Request) (jobDetails, vertexInfo, error) {
	d, err := s.jobDetails(r.Context(), r.PathValue("id"))
	if err != nil {
		return jobDetails{}, vertexInfo{}, err
	}
	for _, v := range d.Vertices {
		if v.ID == r.PathValue("vid") {
			return d, v, nil
		}
	}
	return jobDetails{}, vertexInfo{}, fmt.Errorf("%w: job %s has no vertex %q", errNotFound, d.ID, r.PathValue("vid"))
}

// restVertex is Flink's JobVertexDetailsInfo: the vertex and its subtasks.
func (s *Server) restVertex(w http.ResponseWriter, r *http.Request) {
	d, v, err := s.vertex(r)
	if err != nil {
		restError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		ID             string        `json:"id"`
		Name           string        `json:"name"`
		MaxParallelism int           `json:"maxParallelism"`
		Parallelism    int           `json:"parallelism"`
		Now            int64         `json:"now"`
		Subtasks       []subtaskInfo `json:"subtasks"`
	}{v.ID, v.Name, v.MaxParallelism, v.Parallelism, d.Now, v.Subtasks})
}

// backPressureLevel is Flink's level of a back-pressured share of the
// time: ok up to 10%, low up to 50%, high above.
func backPressureLevel(ratio float64) string {
	switch {
	case ratio <= 0.10:
		return "ok"
	case ratio <= 0.5:
		return "low"
	}
	return "high"
}

// subtaskBackPressure is Flink's SubtaskBackPressureInfo.
type subtaskBackPressure struct {
	Subtask            int     `json:"subtask"`
	AttemptNumber      int     `json:"attempt-number"`
	Level              string  `json:"backpressure-level"`
	Ratio              float64 `json:"ratio"`
	IdleRatio          float64 `json:"idleRatio"`
	BusyRatio          float64 `json:"busyRatio"`
	BackPressuredRatio float64 `json:"backPressuredRatio"`
}

// restBackPressure is Flink's JobVertexBackPressureInfo: each subtask's
// back-pressured share of the time between its task manager's last two
// heartbeats (Flink's backPressuredTimeMsPerSecond / 1000). Weir measures
// no idle or busy time: those ratios are 0. status is "deprecated" until
// every subtask's ratio is known.
func (s *Server) restBackPressure(w http.ResponseWriter, r *http.Request) {
	d, v, err := s.vertex(r)
	if err != nil {
		restError(w, err)
		return
	}
	out := struct {
		Status   string                `json:"status"`
		Level    string                `json:"backpressure-level"`
		End      int64                 `json:"end-timestamp"`
		Subtasks []subtaskBackPressure `json:"subtasks"`
		maxRatio float64
		allKnown bool
	}{Status: "ok", End: d.Now, Subtasks: []subtaskBackPressure{}, allKnown: true}
	for _, st := range v.Subtasks {
		out.Subtasks = append(out.Subtasks, subtaskBackPressure{Subtask: st.Subtask, AttemptNumber: st.Attempt,
			Level: backPressureLevel(st.backPressured), Ratio: st.backPressured, BackPressuredRatio: st.backPressured})
		out.maxRatio = max(out.maxRatio, st.backPressured)
		out.allKnown = out.allKnown && st.bpKnown
	}
	out.Level = backPressureLevel(out.maxRatio)
	if !out.allKnown {
		out.Status = "deprecated"
	}
	writeJSON(w, http.StatusOK, out)
}

// vertexWatermark is the least input watermark of subtasks, nil unless
// every subtask reported one past math.MinInt64 (before its first
// watermark).
func vertexWatermark(subtasks []subtaskInfo) *int64 {
	if len(subtasks) == 0 {
		return nil
	}
	wm := int64(math.MaxInt64)
	for _, st := range subtasks {
		if !st.known || st.inputWatermark == math.MinInt64 {
			return nil
		}
		wm = min(wm, st.inputWatermark)
	}
	return &wm
}

// metricValue is one entry of Flink's MetricCollectionResponseBody: a
// metric's id and its value as a string.
type metricValue struct {
	ID    string `json:"id"`
	Value string `json:"value"`
}

// restWatermarks is Flink's JobVertexWatermarksHandler: each subtask's
// currentInputWatermark ("<subtask>.currentInputWatermark", epoch ms,
// -9223372036854775808 before its first), for the subtasks whose stats
// came in a heartbeat.
func (s *Server) restWatermarks(w http.ResponseWriter, r *http.Request) {
	_, v, err := s.vertex(r)
	if err != nil {
		restError(w, err)
		return
	}
	out := []metricValue{}
	for _, st := range v.Subtasks {
		if st.known {
			out = append(out, metricValue{ID: strconv.Itoa(st.Subtask) + ".currentInputWatermark", Value: strconv.FormatInt(st.inputWatermark, 10)})
		}
	}
	writeJSON(w, http.StatusOK, out)
}
