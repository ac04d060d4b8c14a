package jobmanager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/jobmanager/dashboard"
	"github.com/weirstream/weir/runtime"
)

// The REST API (docs/metrics.md, README "REST API"): JSON in the shapes of
// Flink's REST API where a Flink user would look for them, and Prometheus'
// /metrics, on the job manager's HTTP address. Every request carries the
// job manager's token when it has one (rpc.RequireToken).

// cancelTimeout bounds how long a cancel request waits for the job's tasks
// to stop.
const cancelTimeout = time.Minute

// HTTPHandler returns the job manager's HTTP API: GET /jobs,
// /jobs/overview, /jobs/{id}, /jobs/{id}/checkpoints, /jobs/{id}/exceptions,
// /taskmanagers and
// /metrics; POST /jobs/{id}/cancel and PATCH /jobs/{id}?mode=cancel; and
// the web dashboard at GET / (package dashboard). The API requires the
// token; the dashboard's files hold no data and are served without it.
func (s *Server) HTTPHandler() http.Handler {
	root := http.NewServeMux()
	ui := dashboard.Handler()
	root.Handle("GET /{$}", ui)
	root.Handle("GET /static/", ui)
	root.Handle("/", rpc.RequireToken(s.cfg.token, s.apiHandler(), rpc.LogRejections(s.rejects)))
	return root
}

// apiHandler is the REST API and /metrics, without the token check.
func (s *Server) apiHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /jobs", s.restJobs)
	mux.HandleFunc("GET /jobs/overview", s.restOverview)
	mux.HandleFunc("GET /jobs/{id}", s.restJob)
	mux.HandleFunc("PATCH /jobs/{id}", s.restPatchJob)
	mux.HandleFunc("POST /jobs/{id}/cancel", s.restCancel)
	mux.HandleFunc("GET /jobs/{id}/checkpoints", s.restCheckpoints)
	mux.HandleFunc("GET /jobs/{id}/exceptions", s.restExceptions)
	mux.HandleFunc("GET /taskmanagers", s.restTaskManagers)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics, promhttp.HandlerOpts{ErrorLog: zapErrorLog{s}}))
	return mux
}

// zapErrorLog logs promhttp's errors (a metric that failed to collect).
type zapErrorLog struct{ s *Server }

func (l zapErrorLog) Println(v ...any) { l.s.cfg.log.Warn("metrics: " + fmt.Sprint(v...)) }

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// restError answers with Flink's error body, {"errors": [...]}.
func restError(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, ErrJobNotFound):
		code = http.StatusNotFound
	case errors.Is(err, errBadRequest):
		code = http.StatusBadRequest
	case errors.Is(err, context.DeadlineExceeded):
		code = http.StatusGatewayTimeout
	}
	writeJSON(w, code, map[string][]string{"errors": {err.Error()}})
}

var errBadRequest = errors.New("bad request")

func (s *Server) restJobs(w http.ResponseWriter, r *http.Request) {
	recs, err := s.Jobs(r.Context())
	if err != nil {
		restError(w, err)
		return
	}
	type job struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	out := struct {
		Jobs []job `json:"jobs"`
	}{Jobs: []job{}}
	for _, rec := range recs {
		out.Jobs = append(out.Jobs, job{rec.ID, string(rec.State)})
	}
	writeJSON(w, http.StatusOK, out)
}

// jobTimes are a job's Flink timestamps: start-time, end-time (-1 while it
// runs, or when this job manager did not see it end) and duration (-1 when
// unknown).
type jobTimes struct {
	Start    int64 `json:"start-time"`
	End      int64 `json:"end-time"`
	Duration int64 `json:"duration"`
}

func (s *Server) times(rec JobRecord) jobTimes {
	t := jobTimes{Start: rec.SubmittedUnixMs, End: -1, Duration: -1}
	switch rec.State {
	case StateFinished, StateFailed, StateCanceled:
		if st := s.statsOf(rec.ID); st != nil {
			if end := st.stopTime(); !end.IsZero() {
				t.End = end.UnixMilli()
				t.Duration = t.End - t.Start
			}
		}
	default:
		t.Duration = time.Now().UnixMilli() - t.Start
	}
	return t
}

type jobOverview struct {
	ID    string `json:"jid"`
	Name  string `json:"name"`
	State string `json:"state"`
	jobTimes
	Restarts int `json:"restarts"`
}

func (s *Server) restOverview(w http.ResponseWriter, r *http.Request) {
	recs, err := s.Jobs(r.Context())
	if err != nil {
		restError(w, err)
		return
	}
	out := struct {
		Jobs []jobOverview `json:"jobs"`
	}{Jobs: []jobOverview{}}
	for _, rec := range recs {
		out.Jobs = append(out.Jobs, jobOverview{rec.ID, rec.DisplayName(), string(rec.State), s.times(rec), rec.Restarts})
	}
	writeJSON(w, http.StatusOK, out)
}

// vertexMetrics are Flink's per-vertex (and per-subtask) record metrics:
// read-records are the records a task received, or (a source) emitted;
// write-records those it sent downstream, or (a sink) wrote.
type vertexMetrics struct {
	ReadRecords          int64 `json:"read-records"`
	ReadRecordsComplete  bool  `json:"read-records-complete"`
	WriteRecords         int64 `json:"write-records"`
	WriteRecordsComplete bool  `json:"write-records-complete"`
	BackPressuredMs      int64 `json:"accumulated-backpressured-time"`
	// PendingRecords is Flink's source metric pendingRecords (records of
	// the input not yet done), on a source that reports it.
	PendingRecords *int64 `json:"pendingRecords,omitempty"`
}

type subtaskInfo struct {
	Subtask     int           `json:"subtask"`
	TaskID      string        `json:"task_id"`
	Status      string        `json:"status"`
	TaskManager string        `json:"taskmanager_id,omitempty"`
	Metrics     vertexMetrics `json:"metrics"`
}

type vertexInfo struct {
	ID          string         `json:"id"`
	Name        string         `json:"name"`
	Parallelism int            `json:"parallelism"`
	Status      string         `json:"status"`
	Operators   []string       `json:"operators"`
	Tasks       map[string]int `json:"tasks"`
	Metrics     vertexMetrics  `json:"metrics"`
	Subtasks    []subtaskInfo  `json:"subtasks"`
}

type planInput struct {
	Num          int    `json:"num"`
	ID           string `json:"id"`
	ShipStrategy string `json:"ship_strategy"`
}

type planNode struct {
	ID          string      `json:"id"`
	Parallelism int         `json:"parallelism"`
	Description string      `json:"description"`
	Inputs      []planInput `json:"inputs,omitempty"`
}

type jobPlan struct {
	ID    string     `json:"jid"`
	Name  string     `json:"name"`
	Nodes []planNode `json:"nodes"`
}

type jobDetails struct {
	ID    string `json:"jid"`
	Name  string `json:"name"`
	State string `json:"state"`
	jobTimes
	Now                     int64             `json:"now"`
	Restarts                int               `json:"restarts"`
	Attempt                 int               `json:"attempt"`
	LastCompletedCheckpoint uint64            `json:"last_completed_checkpoint"`
	RestoredFromCheckpoint  uint64            `json:"restored_from_checkpoint"`
	RecordsIn               int64             `json:"records_in"`
	RecordsOut              int64             `json:"records_out"`
	Error                   string            `json:"error"`
	Waiting                 string            `json:"waiting"`
	Params                  map[string]string `json:"params"`
	CheckpointIntervalMs    int64             `json:"checkpoint_interval_ms"`
	RestartStrategy         string            `json:"restart_strategy"`
	Vertices                []vertexInfo      `json:"vertices"`
	StatusCounts            map[string]int    `json:"status-counts"`
	Plan                    jobPlan           `json:"plan"`
}

func (s *Server) restJob(w http.ResponseWriter, r *http.Request) {
	d, err := s.jobDetails(r.Context(), r.PathValue("id"))
	if err != nil {
		restError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// jobDetails renders job id: its record, its graph and where its current
// attempt's tasks run.
func (s *Server) jobDetails(ctx context.Context, id string) (jobDetails, error) {
	rec, last, err := s.Job(ctx, id)
	if err != nil {
		return jobDetails{}, err
	}
	d := jobDetails{ID: rec.ID, Name: rec.DisplayName(), Waiting: rec.Waiting, State: string(rec.State), jobTimes: s.times(rec), Now: time.Now().UnixMilli(),
		Restarts: rec.Restarts, LastCompletedCheckpoint: uint64(last), RestoredFromCheckpoint: uint64(rec.RestoredFrom),
		RecordsIn: rec.Records.In, RecordsOut: rec.Records.Out, Error: rec.Error, Params: rec.Params,
		CheckpointIntervalMs: rec.CheckpointIntervalMs, RestartStrategy: restartStrategyInForce(rec.RestartStrategy),
		Vertices: []vertexInfo{}, StatusCounts: map[string]int{}, Plan: jobPlan{ID: rec.ID, Name: rec.DisplayName(), Nodes: []planNode{}}}
	graph, placed, attempt := s.graphOf(rec)
	d.Attempt = attempt
	for _, v := range graph.Vertices {
		vi := vertexInfo{ID: v.ID, Name: v.Name, Parallelism: v.Parallelism, Operators: v.Operators, Tasks: map[string]int{},
			Subtasks: []subtaskInfo{}, Metrics: vertexMetrics{ReadRecordsComplete: true, WriteRecordsComplete: true}}
		for i, t := range v.Tasks {
			si := subtaskInfo{Subtask: i, TaskID: string(t), Status: string(rec.State)}
			if p, ok := placed[t]; ok {
				si.TaskManager = p.taskManager
				si.Status = taskStatus(rec.State, p)
				si.Metrics = vertexMetrics{ReadRecords: p.stats.RecordsIn, ReadRecordsComplete: p.known,
					WriteRecords: p.stats.RecordsOut, WriteRecordsComplete: p.known, BackPressuredMs: p.stats.BackPressured.Milliseconds()}
				if n := p.stats.PendingRecords; p.known && n >= 0 {
					si.Metrics.PendingRecords = &n
					vi.Metrics.PendingRecords = ptr(n + deref(vi.Metrics.PendingRecords))
				}
			}
			vi.Metrics.ReadRecords += si.Metrics.ReadRecords
			vi.Metrics.WriteRecords += si.Metrics.WriteRecords
			vi.Metrics.BackPressuredMs += si.Metrics.BackPressuredMs
			vi.Metrics.ReadRecordsComplete = vi.Metrics.ReadRecordsComplete && si.Metrics.ReadRecordsComplete
			vi.Metrics.WriteRecordsComplete = vi.Metrics.WriteRecordsComplete && si.Metrics.WriteRecordsComplete
			vi.Tasks[si.Status]++
			vi.Subtasks = append(vi.Subtasks, si)
		}
		vi.Status = vertexStatus(vi.Tasks, rec.State)
		d.StatusCounts[vi.Status]++
		d.Vertices = append(d.Vertices, vi)
		d.Plan.Nodes = append(d.Plan.Nodes, planNode{ID: v.ID, Parallelism: v.Parallelism, Description: v.Name})
	}
	for _, e := range graph.Edges {
		for i := range d.Plan.Nodes {
			if n := &d.Plan.Nodes[i]; n.ID == e.To {
				n.Inputs = append(n.Inputs, planInput{Num: len(n.Inputs), ID: e.From, ShipStrategy: e.Ship})
			}
		}
	}
	return d, nil
}

// graphOf returns the job's graph and, while it runs here, where its
// current attempt's tasks are and the attempt's number.
func (s *Server) graphOf(rec JobRecord) (runtime.Graph, map[checkpoint.TaskID]placedTask, int) {
	s.jobs.mu.Lock()
	rj := s.jobs.running[rec.ID]
	s.jobs.mu.Unlock()
	if rj != nil {
		var placed map[checkpoint.TaskID]placedTask
		attempt := 0
		if rd := rj.attempt(); rd != nil {
			placed = rd.tasks()
			if len(rd.shares) > 0 {
				attempt = int(rd.shares[0].key.attempt)
			}
		}
		return rj.graph, placed, attempt
	}
	job, err := s.cfg.jobs.Build(rec.Type, rec.Params)
	if err != nil {
		return runtime.Graph{}, nil, 0
	}
	g, err := job.Graph()
	if err != nil {
		return runtime.Graph{}, nil, 0
	}
	return g, nil, 0
}

// taskStatus is a task's Flink execution state.
func taskStatus(job JobState, p placedTask) string {
	switch {
	case p.finished:
		return "FINISHED"
	case p.ended:
		return string(StateCanceled)
	case job == StateRunning:
		return "RUNNING"
	case job == StateCreated:
		return "DEPLOYING"
	}
	return string(job)
}

// vertexStatus aggregates its subtasks' states as Flink does: the state
// they share, or RUNNING while any runs.
func vertexStatus(tasks map[string]int, job JobState) string {
	if len(tasks) == 1 {
		for st := range tasks {
			return st
		}
	}
	if tasks["RUNNING"] > 0 {
		return "RUNNING"
	}
	return string(job)
}

func (s *Server) restPatchJob(w http.ResponseWriter, r *http.Request) {
	if mode := r.URL.Query().Get("mode"); mode != "cancel" {
		restError(w, fmt.Errorf("%w: PATCH /jobs/{id} needs mode=cancel, got %q", errBadRequest, mode))
		return
	}
	s.restCancel(w, r)
}

func (s *Server) restCancel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), cancelTimeout)
	defer cancel()
	if _, err := s.Cancel(ctx, id); err != nil {
		restError(w, err)
		return
	}
	d, err := s.jobDetails(ctx, id)
	if err != nil {
		restError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// Flink's checkpoint statistics shapes.
type (
	cpCounts struct {
		Restored   int `json:"restored"`
		Total      int `json:"total"`
		InProgress int `json:"in_progress"`
		Completed  int `json:"completed"`
		Failed     int `json:"failed"`
	}
	cpHistory struct {
		ID                 uint64 `json:"id"`
		Status             string `json:"status"`
		IsSavepoint        bool   `json:"is_savepoint"`
		TriggerTimestamp   int64  `json:"trigger_timestamp"`
		LatestAckTimestamp int64  `json:"latest_ack_timestamp"`
		EndToEndDuration   int64  `json:"end_to_end_duration"`
		StateSize          int64  `json:"state_size"`
		FailureTimestamp   int64  `json:"failure_timestamp,omitempty"`
		FailureMessage     string `json:"failure_message,omitempty"`
	}
	cpRestored struct {
		ID               uint64 `json:"id"`
		RestoreTimestamp int64  `json:"restore_timestamp"`
		IsSavepoint      bool   `json:"is_savepoint"`
	}
	cpLatest struct {
		Completed *cpHistory  `json:"completed"`
		Savepoint *cpHistory  `json:"savepoint"`
		Failed    *cpHistory  `json:"failed"`
		Restored  *cpRestored `json:"restored"`
	}
	cpResponse struct {
		Counts  cpCounts    `json:"counts"`
		Latest  cpLatest    `json:"latest"`
		History []cpHistory `json:"history"`
	}
)

func historyOf(e cpEntry) cpHistory {
	h := cpHistory{ID: uint64(e.ID), Status: e.Status, TriggerTimestamp: e.Triggered.UnixMilli(), FailureMessage: e.Failure}
	switch e.Status {
	case cpCompleted:
		h.LatestAckTimestamp, h.EndToEndDuration, h.StateSize = e.Ended.UnixMilli(), e.Ended.Sub(e.Triggered).Milliseconds(), e.Size
	case cpFailed:
		h.FailureTimestamp, h.EndToEndDuration = e.Ended.UnixMilli(), e.Ended.Sub(e.Triggered).Milliseconds()
	default:
		h.EndToEndDuration = time.Since(e.Triggered).Milliseconds()
	}
	return h
}

func (s *Server) restCheckpoints(w http.ResponseWriter, r *http.Request) {
	out, err := s.checkpointStats(r.Context(), r.PathValue("id"))
	if err != nil {
		restError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// checkpointStats renders job id's checkpoint statistics: those this job
// manager saw, and the completed checkpoints its store retains beyond them
// (e.g. from before it started).
func (s *Server) checkpointStats(ctx context.Context, id string) (cpResponse, error) {
	if _, err := s.jobs.store.Get(id); err != nil {
		return cpResponse{}, err
	}
	var snap cpSnapshot
	if st := s.statsOf(id); st != nil {
		snap = st.snapshot()
	}
	out := cpResponse{History: []cpHistory{}, Counts: cpCounts{Restored: snap.Restored, InProgress: snap.InProgress,
		Completed: snap.Completed, Failed: snap.Failed, Total: snap.Completed + snap.Failed + snap.InProgress}}
	seen := map[uint64]bool{}
	for _, e := range snap.History {
		out.History = append(out.History, historyOf(e))
		seen[uint64(e.ID)] = true
	}
	sums, err := s.jobs.cps.List(ctx, id)
	if err != nil {
		return cpResponse{}, err
	}
	for _, c := range sums {
		if c.Err != nil || seen[uint64(c.ID)] {
			continue
		}
		out.History = append(out.History, cpHistory{ID: uint64(c.ID), Status: cpCompleted, TriggerTimestamp: c.TriggeredAt.UnixMilli(),
			LatestAckTimestamp: c.CompletedAt.UnixMilli(), EndToEndDuration: c.Duration.Milliseconds(), StateSize: c.Size})
	}
	sort.Slice(out.History, func(i, j int) bool { return out.History[i].ID > out.History[j].ID })
	for i := range out.History {
		if h := &out.History[i]; h.Status == cpCompleted {
			out.Latest.Completed = h
			break
		}
	}
	if snap.LastFailed != nil {
		f := historyOf(*snap.LastFailed)
		out.Latest.Failed = &f
	}
	if snap.LastRestore != nil {
		out.Latest.Restored = &cpRestored{ID: uint64(snap.LastRestore.ID), RestoreTimestamp: snap.LastRestore.At.UnixMilli()}
	}
	return out, nil
}

func (s *Server) statsOf(id string) *cpStats {
	s.jobs.mu.Lock()
	defer s.jobs.mu.Unlock()
	return s.jobs.stats[id]
}

// taskManagerInfo keeps the fields GET /taskmanagers always had and adds
// Flink's names for the slots.
type taskManagerInfo struct {
	ID             string `json:"id"`
	Slots          int    `json:"slots"`
	FreeSlots      int    `json:"free_slots"`
	DataHost       string `json:"data_host"`
	Session        uint64 `json:"session"`
	HeartbeatAgeMs int64  `json:"heartbeat_age_ms"`
	SlotsNumber    int    `json:"slotsNumber"`
	FreeSlotsFlink int    `json:"freeSlots"`
}

func (s *Server) restTaskManagers(w http.ResponseWriter, _ *http.Request) {
	out := []taskManagerInfo{}
	for _, t := range s.TaskManagers() {
		free := t.Slots - t.UsedSlots
		out = append(out, taskManagerInfo{t.ID, t.Slots, free, t.DataHost, t.Session, t.HeartbeatAge.Milliseconds(), t.Slots, free})
	}
	writeJSON(w, http.StatusOK, out)
}

// Flink's job exceptions shapes (JobExceptionsInfoWithHistory): the
// deprecated root-exception fields of the latest failure, and the history.
type (
	exceptionInfo struct {
		ExceptionName string            `json:"exceptionName"`
		Stacktrace    string            `json:"stacktrace"`
		Timestamp     int64             `json:"timestamp"`
		TaskName      *string           `json:"taskName"`
		Location      *string           `json:"location"`
		Endpoint      *string           `json:"endpoint"`
		TaskManagerID *string           `json:"taskManagerId"`
		FailureLabels map[string]string `json:"failureLabels"`
	}
	rootExceptionInfo struct {
		exceptionInfo
		ConcurrentExceptions []exceptionInfo `json:"concurrentExceptions"`
	}
	executionExceptionInfo struct {
		Exception     string `json:"exception"`
		Task          string `json:"task"`
		Location      string `json:"location"`
		Timestamp     int64  `json:"timestamp"`
		TaskManagerID string `json:"taskManagerId"`
	}
	exceptionHistory struct {
		Entries   []rootExceptionInfo `json:"entries"`
		Truncated bool                `json:"truncated"`
	}
	jobExceptions struct {
		RootException    *string                  `json:"root-exception"`
		Timestamp        *int64                   `json:"timestamp"`
		AllExceptions    []executionExceptionInfo `json:"all-exceptions"`
		Truncated        bool                     `json:"truncated"`
		ExceptionHistory exceptionHistory         `json:"exceptionHistory"`
	}
)

// orNil is s, or nil (JSON null, as Flink leaves an unknown field) if empty.
func orNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// exceptionInfoOf renders e as Flink's ExceptionInfo: a Go error has no
// class and no stack, so exceptionName is the message's first line and
// stacktrace the whole message (with whether the job restarted).
func exceptionInfoOf(e JobException) exceptionInfo {
	name, _, _ := strings.Cut(e.Message, "\n")
	trace := e.Message
	if e.Restarted {
		trace += "\n(the job restarted from its latest completed checkpoint)"
	} else {
		trace += "\n(the job failed)"
	}
	return exceptionInfo{ExceptionName: name, Stacktrace: trace, Timestamp: e.UnixMs, TaskName: orNil(e.Task),
		Location: orNil(e.TaskManager), Endpoint: orNil(e.TaskManager), TaskManagerID: orNil(e.TaskManager),
		FailureLabels: map[string]string{}}
}

// jobExceptionsOf renders r's exception history in Flink's shape, newest
// first.
func jobExceptionsOf(r JobRecord) jobExceptions {
	out := jobExceptions{AllExceptions: []executionExceptionInfo{},
		ExceptionHistory: exceptionHistory{Entries: []rootExceptionInfo{}, Truncated: r.ExceptionsTruncated}}
	for i := len(r.Exceptions) - 1; i >= 0; i-- {
		out.ExceptionHistory.Entries = append(out.ExceptionHistory.Entries,
			rootExceptionInfo{exceptionInfo: exceptionInfoOf(r.Exceptions[i]), ConcurrentExceptions: []exceptionInfo{}})
	}
	if e := r.LastException(); e != nil {
		info := exceptionInfoOf(*e)
		out.RootException, out.Timestamp = &info.Stacktrace, &e.UnixMs
		if e.Task != "" {
			out.AllExceptions = append(out.AllExceptions, executionExceptionInfo{Exception: info.Stacktrace, Task: e.Task,
				Location: e.TaskManager, Timestamp: e.UnixMs, TaskManagerID: e.TaskManager})
		}
	}
	return out
}

func (s *Server) restExceptions(w http.ResponseWriter, r *http.Request) {
	rec, _, err := s.Job(r.Context(), r.PathValue("id"))
	if err != nil {
		restError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, jobExceptionsOf(rec))
}

func ptr(n int64) *int64 { return &n }

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}
