package jobmanager

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/jobmanager/dashboard"
	"github.com/weirstream/weir/runtime"
)

// The REST API (docs/reference/rest.md): JSON in the shapes of Flink's
// REST API (its field names and JSON types, so that a tool written for
// Flink's API reads Weir's), plus Weir's own fields, and Prometheus'
// /metrics, on the job manager's HTTP address. Every request carries the
// job manager's token when it has one (rpc.RequireToken). In front of
// everything, one guard against browsers (rpc.BrowserGuard): the Host
// header must name this job manager (HTTPHosts), and a state-changing
// request must not be one a web page can send cross-site.

// cancelTimeout bounds how long a POST cancel waits for the job's tasks
// to stop.
const cancelTimeout = time.Minute

// HTTPHandler returns the job manager's HTTP API (the routes of apiHandler,
// docs/reference/rest.md) and the web dashboard at GET / (package
// dashboard). The API requires the token; the dashboard's files hold no
// data and are served without it, as is GET /readyz (restReady). Every
// request passes rpc.BrowserGuard first.
func (s *Server) HTTPHandler() http.Handler {
	root := http.NewServeMux()
	ui := dashboard.Handler()
	root.Handle("GET /{$}", ui)
	root.Handle("GET /static/", ui)
	root.HandleFunc("GET /readyz", s.restReady)
	root.Handle("/", rpc.RequireToken(s.cfg.token, s.gateHTTP(s.apiHandler()), rpc.LogRejections(s.rejects)))
	return rpc.BrowserGuard(s.cfg.hosts, root, rpc.LogRejections(s.rejects))
}

// apiHandler is the REST API and /metrics, without the token check.
func (s *Server) apiHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /overview", s.restClusterOverview)
	mux.HandleFunc("GET /config", s.restDashboardConfig)
	mux.HandleFunc("GET /jobs", s.restJobs)
	mux.HandleFunc("GET /jobs/overview", s.restOverview)
	mux.HandleFunc("GET /jobs/{id}", s.restJob)
	mux.HandleFunc("PATCH /jobs/{id}", s.restPatchJob)
	mux.HandleFunc("POST /jobs/{id}/cancel", s.restCancel)
	mux.HandleFunc("GET /jobs/{id}/config", s.restJobConfig)
	mux.HandleFunc("GET /jobs/{id}/plan", s.restPlan)
	mux.HandleFunc("GET /jobs/{id}/vertices/{vid}", s.restVertex)
	mux.HandleFunc("GET /jobs/{id}/vertices/{vid}/backpressure", s.restBackPressure)
	mux.HandleFunc("GET /jobs/{id}/vertices/{vid}/watermarks", s.restWatermarks)
	mux.HandleFunc("GET /jobs/{id}/checkpoints", s.restCheckpoints)
	mux.HandleFunc("GET /jobs/{id}/checkpoints/config", s.restCheckpointConfig)
	mux.HandleFunc("GET /jobs/{id}/checkpoints/details/{cid}", s.restCheckpointDetails)
	mux.HandleFunc("GET /jobs/{id}/checkpoints/details/{cid}/subtasks/{vid}", s.restCheckpointSubtasks)
	mux.HandleFunc("GET /jobs/{id}/exceptions", s.restExceptions)
	mux.HandleFunc("POST /jobs/{id}/savepoints", s.restTriggerSavepoint)
	mux.HandleFunc("GET /jobs/{id}/savepoints", s.restSavepoints)
	mux.HandleFunc("GET /jobs/{id}/savepoints/{triggerid}", s.restSavepointStatus)
	mux.HandleFunc("POST /jobs/{id}/stop", s.restStop)
	mux.HandleFunc("GET /taskmanagers", s.restTaskManagers)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics, promhttp.HandlerOpts{ErrorLog: zapErrorLog{s}}))
	return jsonErrors(mux)
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
	case errors.Is(err, ErrJobNotFound), errors.Is(err, errNotFound):
		code = http.StatusNotFound
	case errors.Is(err, errBadRequest), badSavepoint(err):
		code = http.StatusBadRequest
	case errors.Is(err, ErrJobEnded):
		code = http.StatusConflict
	case errors.Is(err, context.DeadlineExceeded):
		code = http.StatusGatewayTimeout
	}
	writeJSON(w, code, flinkErrors{Errors: []string{err.Error()}})
}

// flinkErrors is Flink's error body.
type flinkErrors struct {
	Errors []string `json:"errors"`
}

var (
	errBadRequest = errors.New("bad request")
	errNotFound   = errors.New("not found")
)

// jsonErrors answers the mux's own refusals (no such route: 404; a method
// the route does not serve: 405, with its Allow header) with Flink's error
// body instead of the mux's text.
func jsonErrors(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		probe := &statusProbe{header: http.Header{}}
		mux.ServeHTTP(probe, r)
		if allow := probe.header.Get("Allow"); allow != "" {
			w.Header().Set("Allow", allow)
		}
		code := cmp.Or(probe.code, http.StatusNotFound)
		writeJSON(w, code, flinkErrors{Errors: []string{fmt.Sprintf("%s %s: %s", r.Method, r.URL.Path, strings.ToLower(http.StatusText(code)))}})
	})
}

// statusProbe records the status and headers of the mux's refusal.
type statusProbe struct {
	header http.Header
	code   int
}

func (p *statusProbe) Header() http.Header         { return p.header }
func (p *statusProbe) Write(b []byte) (int, error) { return len(b), nil }
func (p *statusProbe) WriteHeader(code int)        { p.code = code }

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

// executionStates are Flink's task (execution) states, in its order.
var executionStates = [...]string{"CREATED", "SCHEDULED", "DEPLOYING", "RUNNING", "FINISHED", "CANCELING", "CANCELED",
	"FAILED", "RECONCILING", "INITIALIZING"}

// jobStates are Flink's job states, in its order.
var jobStates = [...]string{"INITIALIZING", "CREATED", "RUNNING", "FAILING", "FAILED", "CANCELLING", "CANCELED",
	"FINISHED", "RESTARTING", "SUSPENDED", "RECONCILING"}

// stateCounts counts tasks per execution state, every state present.
func stateCounts() map[string]int {
	m := make(map[string]int, len(executionStates))
	for _, st := range executionStates {
		m[st] = 0
	}
	return m
}

// jobOverview is Flink's JobDetails (GET /jobs/overview) and Weir's
// restarts.
type jobOverview struct {
	ID    string `json:"jid"`
	Name  string `json:"name"`
	State string `json:"state"`
	jobTimes
	LastModification int64          `json:"last-modification"`
	Tasks            map[string]int `json:"tasks"`
	Restarts         int            `json:"restarts"`
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
		d := s.details(rec, 0)
		tasks := map[string]int{"total": 0}
		for _, v := range d.Vertices {
			for st, n := range v.Tasks {
				tasks[strings.ToLower(st)] += n
				tasks["total"] += n
			}
		}
		out.Jobs = append(out.Jobs, jobOverview{ID: rec.ID, Name: rec.DisplayName(), State: string(rec.State), jobTimes: d.jobTimes,
			LastModification: d.LastModification, Tasks: tasks, Restarts: rec.Restarts})
	}
	writeJSON(w, http.StatusOK, out)
}

// ioMetrics are Flink's IOMetricsInfo: per vertex and per subtask.
// read-records are the records a task received, or (a source) emitted;
// write-records those it sent downstream, or (a sink) wrote. Weir counts no
// bytes, idle or busy time: those are 0 (the *-complete flags false).
type ioMetrics struct {
	ReadBytes            int64   `json:"read-bytes"`
	ReadBytesComplete    bool    `json:"read-bytes-complete"`
	WriteBytes           int64   `json:"write-bytes"`
	WriteBytesComplete   bool    `json:"write-bytes-complete"`
	ReadRecords          int64   `json:"read-records"`
	ReadRecordsComplete  bool    `json:"read-records-complete"`
	WriteRecords         int64   `json:"write-records"`
	WriteRecordsComplete bool    `json:"write-records-complete"`
	BackPressuredMs      int64   `json:"accumulated-backpressured-time"`
	IdleMs               int64   `json:"accumulated-idle-time"`
	BusyMs               float64 `json:"accumulated-busy-time"`
	// PendingRecords is Flink's source metric pendingRecords (records of
	// the input not yet done), on a source that reports it.
	PendingRecords *int64 `json:"pendingRecords,omitempty"`
	// RecordsLagMax is Flink's records-lag-max: the records not yet done
	// of the most lagging input partition (of the subtask; of the vertex's
	// subtasks), on a source that reports pendingRecords per partition.
	RecordsLagMax *int64 `json:"records-lag-max,omitempty"`
}

// subtaskInfo is Flink's SubtaskExecutionAttemptDetailsInfo and Weir's
// task id.
type subtaskInfo struct {
	Subtask        int              `json:"subtask"`
	TaskID         string           `json:"task_id"`
	Status         string           `json:"status"`
	Attempt        int              `json:"attempt"`
	Host           string           `json:"host"`
	Endpoint       string           `json:"endpoint"`
	Start          int64            `json:"start-time"`
	End            int64            `json:"end-time"`
	Duration       int64            `json:"duration"`
	Metrics        ioMetrics        `json:"metrics"`
	TaskManager    string           `json:"taskmanager-id"`
	StatusDuration map[string]int64 `json:"status-duration"`

	backPressured float64 // share of the time, between the last two heartbeats
	bpKnown       bool
	// inputWatermark is the task's currentInputWatermark (math.MinInt64
	// before the first), known when stats came in a heartbeat.
	inputWatermark int64
	known          bool
}

// vertexInfo is Flink's JobVertexDetailsInfo as GET /jobs/{id} lists it,
// and Weir's operators and subtasks.
type vertexInfo struct {
	ID             string `json:"id"`
	Name           string `json:"name"`
	MaxParallelism int    `json:"maxParallelism"`
	Parallelism    int    `json:"parallelism"`
	Status         string `json:"status"`
	jobTimes
	Tasks     map[string]int `json:"tasks"`
	Metrics   ioMetrics      `json:"metrics"`
	Operators []string       `json:"operators"`
	Subtasks  []subtaskInfo  `json:"subtasks"`
	// InputWatermark is the vertex's watermark: the least
	// currentInputWatermark of its subtasks (epoch ms), absent until every
	// subtask reported one.
	InputWatermark *int64 `json:"currentInputWatermark,omitempty"`
}

type planInput struct {
	Num          int    `json:"num"`
	ID           string `json:"id"`
	ShipStrategy string `json:"ship_strategy"`
	Exchange     string `json:"exchange"`
}

type planNode struct {
	ID                  string         `json:"id"`
	Parallelism         int            `json:"parallelism"`
	Operator            string         `json:"operator"`
	OperatorStrategy    string         `json:"operator_strategy"`
	Description         string         `json:"description"`
	Inputs              []planInput    `json:"inputs,omitempty"`
	OptimizerProperties map[string]any `json:"optimizer_properties"`
}

type jobPlan struct {
	ID    string     `json:"jid"`
	Name  string     `json:"name"`
	Type  string     `json:"type"`
	Nodes []planNode `json:"nodes"`
}

// jobDetails is Flink's JobDetailsInfo and Weir's own fields.
type jobDetails struct {
	ID          string `json:"jid"`
	Name        string `json:"name"`
	IsStoppable bool   `json:"isStoppable"`
	State       string `json:"state"`
	JobType     string `json:"job-type"`
	jobTimes
	MaxParallelism   int64            `json:"maxParallelism"`
	Now              int64            `json:"now"`
	Timestamps       map[string]int64 `json:"timestamps"`
	Vertices         []vertexInfo     `json:"vertices"`
	StatusCounts     map[string]int   `json:"status-counts"`
	Plan             jobPlan          `json:"plan"`
	LastModification int64            `json:"-"`

	Restarts                int               `json:"restarts"`
	Attempt                 int               `json:"attempt"`
	LastCompletedCheckpoint uint64            `json:"last_completed_checkpoint"`
	RestoredFromCheckpoint  uint64            `json:"restored_from_checkpoint"`
	RecordsIn               int64             `json:"records_in"`
	RecordsOut              int64             `json:"records_out"`
	Error                   string            `json:"error"`
	Waiting                 string            `json:"waiting"`
	NextAttemptAt           int64             `json:"next_attempt_at,omitempty"`
	Params                  map[string]string `json:"params"`
	CheckpointIntervalMs    int64             `json:"checkpoint_interval_ms"`
	RestartStrategy         string            `json:"restart_strategy"`
	StateBackend            string            `json:"state_backend"`
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
// (or last) attempt's tasks run.
func (s *Server) jobDetails(ctx context.Context, id string) (jobDetails, error) {
	rec, last, err := s.Job(ctx, id)
	if err != nil {
		return jobDetails{}, err
	}
	return s.details(rec, last), nil
}

// details renders rec, whose last completed checkpoint is last.
func (s *Server) details(rec JobRecord, last checkpoint.ID) jobDetails {
	now := time.Now().UnixMilli()
	d := jobDetails{ID: rec.ID, Name: rec.DisplayName(), Waiting: rec.Waiting, NextAttemptAt: rec.NextAttemptUnixMs, State: string(rec.State), JobType: "STREAMING", jobTimes: s.times(rec), Now: now,
		Restarts: rec.Restarts, LastCompletedCheckpoint: uint64(last), RestoredFromCheckpoint: uint64(rec.RestoredFrom),
		RecordsIn: rec.Records.In, RecordsOut: rec.Records.Out, Error: rec.Error, Params: rec.Params,
		CheckpointIntervalMs: rec.CheckpointIntervalMs, RestartStrategy: restartStrategyInForce(rec.RestartStrategy),
		StateBackend: stateBackendOf(rec.Params),
		Vertices:     []vertexInfo{}, StatusCounts: stateCounts(), Plan: jobPlan{ID: rec.ID, Name: rec.DisplayName(), Type: "STREAMING", Nodes: []planNode{}},
		Timestamps: map[string]int64{}, LastModification: cmp.Or(rec.ChangedUnixMs, rec.SubmittedUnixMs)}
	for _, st := range jobStates {
		d.Timestamps[st] = 0
	}
	d.Timestamps[string(StateCreated)] = rec.SubmittedUnixMs
	d.Timestamps[string(rec.State)] = max(d.Timestamps[string(rec.State)], rec.ChangedUnixMs)
	graph, placed, attempt := s.graphOf(rec)
	d.Attempt = attempt
	d.MaxParallelism = int64(graph.MaxParallelism)
	for _, v := range graph.Vertices {
		vi := vertexInfo{ID: v.ID, Name: v.Name, MaxParallelism: graph.MaxParallelism, Parallelism: v.Parallelism, Operators: v.Operators,
			Tasks: stateCounts(), Subtasks: []subtaskInfo{}, jobTimes: d.jobTimes,
			Metrics: ioMetrics{ReadRecordsComplete: true, WriteRecordsComplete: true}}
		for i, t := range v.Tasks {
			si := subtaskInfo{Subtask: i, TaskID: string(t), Status: taskStatus(rec.State, placedTask{}, false), Attempt: attempt,
				Start: -1, End: -1, Duration: -1, StatusDuration: map[string]int64{}}
			if p, ok := placed[t]; ok {
				si.TaskManager, si.Host, si.Endpoint = p.taskManager, p.dataHost, p.dataHost
				if !p.started.IsZero() {
					si.Start = p.started.UnixMilli()
					si.Duration = now - si.Start
					if !p.endedAt.IsZero() {
						si.End = p.endedAt.UnixMilli()
						si.Duration = si.End - si.Start
					}
				}
				si.Status = taskStatus(rec.State, p, true)
				si.Metrics = ioMetrics{ReadRecords: p.stats.RecordsIn, ReadRecordsComplete: p.known,
					WriteRecords: p.stats.RecordsOut, WriteRecordsComplete: p.known, BackPressuredMs: p.stats.BackPressured.Milliseconds()}
				si.backPressured, si.bpKnown = p.backPressured, p.bpKnown
				si.inputWatermark, si.known = p.stats.InputWatermark, p.known
				if n := p.stats.PendingRecords; p.known && n >= 0 {
					si.Metrics.PendingRecords = &n
					vi.Metrics.PendingRecords = ptr(n + deref(vi.Metrics.PendingRecords))
				}
				if n := p.stats.RecordsLagMax; p.known && n >= 0 && p.stats.PendingRecords >= 0 {
					si.Metrics.RecordsLagMax = &n
					vi.Metrics.RecordsLagMax = ptr(max(n, deref(vi.Metrics.RecordsLagMax)))
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
		vi.Status = vertexStatus(vi.Tasks)
		vi.InputWatermark = vertexWatermark(vi.Subtasks)
		d.StatusCounts[vi.Status]++
		d.Vertices = append(d.Vertices, vi)
		d.Plan.Nodes = append(d.Plan.Nodes, planNode{ID: v.ID, Parallelism: v.Parallelism, Operator: "", OperatorStrategy: "",
			Description: v.Name, OptimizerProperties: map[string]any{}})
	}
	for _, e := range graph.Edges {
		for i := range d.Plan.Nodes {
			if n := &d.Plan.Nodes[i]; n.ID == e.To {
				n.Inputs = append(n.Inputs, planInput{Num: len(n.Inputs), ID: e.From, ShipStrategy: e.Ship, Exchange: "pipelined_bounded"})
			}
		}
	}
	return d
}

// graphOf returns the job's graph and where its current (or, once it
// ended here, its last) attempt's tasks are, and the attempt's number.
func (s *Server) graphOf(rec JobRecord) (runtime.Graph, map[checkpoint.TaskID]placedTask, int) {
	s.jobs.mu.Lock()
	rj := s.jobs.running[rec.ID]
	end, ended := s.jobs.final[rec.ID]
	s.jobs.mu.Unlock()
	if rj != nil {
		placed, attempt := rj.placement()
		return rj.graph, placed, attempt
	}
	if ended {
		return end.graph, end.placed, end.attempt
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

// placement is where the current attempt's tasks are, with their metrics,
// and the attempt's number (nil and 0 before the first).
func (j *runningJob) placement() (map[checkpoint.TaskID]placedTask, int) {
	rd := j.attempt()
	if rd == nil {
		return nil, 0
	}
	attempt := 0
	if len(rd.shares) > 0 {
		attempt = int(rd.shares[0].key.attempt)
	}
	return rd.tasks(), attempt
}

// taskStatus is a task's Flink execution state in a job in state job;
// placed says whether the current attempt deployed it (p).
func taskStatus(job JobState, p placedTask, placed bool) string {
	switch {
	case placed && p.finished:
		return "FINISHED"
	case placed && p.ended:
		return "CANCELED"
	}
	switch job {
	case StateRunning:
		if placed {
			return "RUNNING"
		}
		return "SCHEDULED"
	case StateCreated:
		if placed {
			return "DEPLOYING"
		}
		return "CREATED"
	case StateRestarting:
		if placed {
			return "CANCELING"
		}
		return "SCHEDULED"
	case StateFinished:
		return "FINISHED"
	case StateFailed:
		return "FAILED"
	}
	return "CANCELED"
}

// vertexStatus aggregates its subtasks' states as Flink does: the state
// they share, else the first present of failed, in-flux and running states.
func vertexStatus(tasks map[string]int) string {
	present := []string{}
	for _, st := range executionStates {
		if tasks[st] > 0 {
			present = append(present, st)
		}
	}
	if len(present) == 1 {
		return present[0]
	}
	for _, st := range []string{"FAILED", "CANCELING", "RUNNING", "DEPLOYING", "SCHEDULED", "CREATED", "CANCELED", "FINISHED"} {
		if tasks[st] > 0 {
			return st
		}
	}
	return "CREATED"
}

// restPatchJob is Flink's PATCH /jobs/{id}?mode=cancel: it starts the
// cancellation and answers 202 at once, as Flink does; GET /jobs/{id}
// shows the job CANCELED once its tasks stopped.
func (s *Server) restPatchJob(w http.ResponseWriter, r *http.Request) {
	if mode := r.URL.Query().Get("mode"); mode != "" && !strings.EqualFold(mode, "cancel") {
		restError(w, fmt.Errorf("%w: PATCH /jobs/{id} takes mode=cancel, got %q", errBadRequest, mode))
		return
	}
	if err := s.CancelAsync(r.PathValue("id")); err != nil {
		restError(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, struct{}{})
}

// restCancel is Weir's POST /jobs/{id}/cancel: it waits (cancelTimeout)
// until the job's tasks stopped and answers its final details.
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
