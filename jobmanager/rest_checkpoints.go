package jobmanager

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/runtime"
)

// Flink's checkpoint statistics shapes (CheckpointingStatistics,
// CheckpointStatistics, TaskCheckpointStatistics, CheckpointConfigInfo),
// served by GET /jobs/{id}/checkpoints, .../checkpoints/details/{cid} and
// .../checkpoints/config.

// notExternallyAddressable is Flink's external_path of a checkpoint that
// has no path of its own: Weir's live in the job manager's store.
const notExternallyAddressable = "<checkpoint-not-externally-addressable>"

type (
	cpCounts struct {
		Restored   int64 `json:"restored"`
		Total      int64 `json:"total"`
		InProgress int   `json:"in_progress"`
		Completed  int64 `json:"completed"`
		Failed     int64 `json:"failed"`
	}
	// statsSummary is Flink's StatsSummaryDto.
	statsSummary struct {
		Min  int64   `json:"min"`
		Max  int64   `json:"max"`
		Avg  int64   `json:"avg"`
		P50  float64 `json:"p50"`
		P90  float64 `json:"p90"`
		P95  float64 `json:"p95"`
		P99  float64 `json:"p99"`
		P999 float64 `json:"p999"`
	}
	// cpSummary is Flink's summary of the completed checkpoints, and
	// Weir's alignment_duration (the longest alignment of each checkpoint).
	cpSummary struct {
		CheckpointedSize  statsSummary `json:"checkpointed_size"`
		StateSize         statsSummary `json:"state_size"`
		EndToEndDuration  statsSummary `json:"end_to_end_duration"`
		AlignmentBuffered statsSummary `json:"alignment_buffered"`
		ProcessedData     statsSummary `json:"processed_data"`
		PersistedData     statsSummary `json:"persisted_data"`
		AlignmentDuration statsSummary `json:"alignment_duration"`
	}
	// taskCheckpoint is Flink's TaskCheckpointStatistics (one vertex's
	// subtasks) and Weir's alignment_duration.
	taskCheckpoint struct {
		ID                      uint64 `json:"id"`
		Status                  string `json:"status"`
		LatestAckTimestamp      int64  `json:"latest_ack_timestamp"`
		CheckpointedSize        int64  `json:"checkpointed_size"`
		StateSize               int64  `json:"state_size"`
		EndToEndDuration        int64  `json:"end_to_end_duration"`
		AlignmentBuffered       int64  `json:"alignment_buffered"`
		ProcessedData           int64  `json:"processed_data"`
		PersistedData           int64  `json:"persisted_data"`
		NumSubtasks             int    `json:"num_subtasks"`
		NumAcknowledgedSubtasks int    `json:"num_acknowledged_subtasks"`
		AlignmentDuration       int64  `json:"alignment_duration"`
		// SyncDuration and AsyncDuration are Weir's: the longest
		// synchronous and asynchronous part among the vertex's
		// acknowledged subtasks (per subtask: .../subtasks/{vid}).
		SyncDuration  int64 `json:"sync_duration"`
		AsyncDuration int64 `json:"async_duration"`
	}
	// cpDurations is Flink's checkpoint_duration of a subtask (and its
	// summary): the synchronous and asynchronous parts of its snapshot.
	cpDurations[T any] struct {
		Sync  T `json:"sync"`
		Async T `json:"async"`
	}
	// cpAlignment is Flink's alignment of a subtask (and its summary).
	cpAlignment[T any] struct {
		Buffered  T `json:"buffered"`
		Processed T `json:"processed"`
		Persisted T `json:"persisted"`
		Duration  T `json:"duration"`
	}
	// subtaskCheckpoint is Flink's SubtaskCheckpointStatistics, completed
	// (acknowledged) or pending_or_failed (index and status only).
	subtaskCheckpoint struct {
		Index               int                 `json:"index"`
		Status              string              `json:"status"`
		AckTimestamp        *int64              `json:"ack_timestamp,omitempty"`
		EndToEndDuration    *int64              `json:"end_to_end_duration,omitempty"`
		StateSize           *int64              `json:"state_size,omitempty"`
		CheckpointedSize    *int64              `json:"checkpointed_size,omitempty"`
		Checkpoint          *cpDurations[int64] `json:"checkpoint,omitempty"`
		Alignment           *cpAlignment[int64] `json:"alignment,omitempty"`
		StartDelay          *int64              `json:"start_delay,omitempty"`
		UnalignedCheckpoint *bool               `json:"unaligned_checkpoint,omitempty"`
		Aborted             *bool               `json:"aborted,omitempty"`
	}
	// subtasksSummary is Flink's TaskCheckpointStatisticsWithSubtaskDetails
	// summary, over the acknowledged subtasks.
	subtasksSummary struct {
		CheckpointedSize    statsSummary              `json:"checkpointed_size"`
		StateSize           statsSummary              `json:"state_size"`
		EndToEndDuration    statsSummary              `json:"end_to_end_duration"`
		CheckpointDuration  cpDurations[statsSummary] `json:"checkpoint_duration"`
		Alignment           cpAlignment[statsSummary] `json:"alignment"`
		StartDelay          statsSummary              `json:"start_delay"`
		UnalignedCheckpoint statsSummary              `json:"unaligned_checkpoint"`
	}
	// taskSubtasks is Flink's TaskCheckpointStatisticsWithSubtaskDetails:
	// one vertex's part of a checkpoint, subtask by subtask.
	taskSubtasks struct {
		taskCheckpoint
		Summary  subtasksSummary     `json:"summary"`
		Subtasks []subtaskCheckpoint `json:"subtasks"`
	}
	// cpHistory is Flink's CheckpointStatistics with the fields of its
	// completed and failed kinds (className says which), and Weir's
	// alignment_duration.
	cpHistory struct {
		ClassName               string                    `json:"className"`
		ID                      uint64                    `json:"id"`
		Status                  string                    `json:"status"`
		IsSavepoint             bool                      `json:"is_savepoint"`
		SavepointFormat         *string                   `json:"savepointFormat"`
		TriggerTimestamp        int64                     `json:"trigger_timestamp"`
		LatestAckTimestamp      int64                     `json:"latest_ack_timestamp"`
		CheckpointedSize        int64                     `json:"checkpointed_size"`
		StateSize               int64                     `json:"state_size"`
		EndToEndDuration        int64                     `json:"end_to_end_duration"`
		AlignmentBuffered       int64                     `json:"alignment_buffered"`
		ProcessedData           int64                     `json:"processed_data"`
		PersistedData           int64                     `json:"persisted_data"`
		NumSubtasks             int                       `json:"num_subtasks"`
		NumAcknowledgedSubtasks int                       `json:"num_acknowledged_subtasks"`
		CheckpointType          string                    `json:"checkpoint_type"`
		Tasks                   map[string]taskCheckpoint `json:"tasks"`
		ExternalPath            string                    `json:"external_path,omitempty"`
		Discarded               *bool                     `json:"discarded,omitempty"`
		FailureTimestamp        int64                     `json:"failure_timestamp,omitempty"`
		FailureMessage          string                    `json:"failure_message,omitempty"`
		AlignmentDuration       int64                     `json:"alignment_duration"`
	}
	cpRestored struct {
		ID               uint64 `json:"id"`
		RestoreTimestamp int64  `json:"restore_timestamp"`
		IsSavepoint      bool   `json:"is_savepoint"`
		ExternalPath     string `json:"external_path"`
	}
	cpLatest struct {
		Completed *cpHistory  `json:"completed"`
		Savepoint *cpHistory  `json:"savepoint"`
		Failed    *cpHistory  `json:"failed"`
		Restored  *cpRestored `json:"restored"`
	}
	cpResponse struct {
		Counts  cpCounts    `json:"counts"`
		Summary cpSummary   `json:"summary"`
		Latest  cpLatest    `json:"latest"`
		History []cpHistory `json:"history"`
	}
)

// classNames are Flink's className of each checkpoint status.
var classNames = map[string]string{cpInProgress: "in_progress", cpCompleted: "completed", cpFailed: "failed"}

// historyOf renders e for a job of tasks subtasks; withTasks adds the
// per-vertex statistics of graph (Flink's details; the history has none).
func historyOf(e cpEntry, tasks int, graph runtime.Graph, withTasks bool) cpHistory {
	h := cpHistory{ClassName: classNames[e.Status], ID: uint64(e.ID), Status: e.Status, TriggerTimestamp: e.Triggered.UnixMilli(),
		FailureMessage: e.Failure, NumSubtasks: tasks, NumAcknowledgedSubtasks: e.Acked, CheckpointType: "CHECKPOINT",
		Tasks: map[string]taskCheckpoint{}, AlignmentDuration: e.Alignment.Milliseconds()}
	if !e.LatestAck.IsZero() {
		h.LatestAckTimestamp = e.LatestAck.UnixMilli()
	}
	switch e.Status {
	case cpCompleted:
		h.LatestAckTimestamp, h.EndToEndDuration, h.StateSize, h.CheckpointedSize = e.Ended.UnixMilli(), e.Ended.Sub(e.Triggered).Milliseconds(), e.Size, e.Uploaded
		h.ExternalPath, h.Discarded = notExternallyAddressable, new(bool)
		if h.NumAcknowledgedSubtasks == 0 {
			h.NumAcknowledgedSubtasks = tasks // completed before this job manager saw its acknowledgements
		}
	case cpFailed:
		h.FailureTimestamp, h.EndToEndDuration = e.Ended.UnixMilli(), e.Ended.Sub(e.Triggered).Milliseconds()
	default:
		h.EndToEndDuration = time.Since(e.Triggered).Milliseconds()
	}
	if !withTasks {
		return h
	}
	for _, v := range graph.Vertices {
		h.Tasks[v.ID] = vertexCheckpoint(e, v, h.TriggerTimestamp)
	}
	return h
}

// vertexCheckpoint sums up vertex v's acknowledgements of e, a checkpoint
// triggered at trigger (Unix ms).
func vertexCheckpoint(e cpEntry, v runtime.GraphVertex, trigger int64) taskCheckpoint {
	tc := taskCheckpoint{ID: uint64(e.ID), Status: e.Status, NumSubtasks: len(v.Tasks)}
	for _, t := range v.Tasks {
		a, ok := e.Acks[t]
		if !ok {
			continue
		}
		tc.NumAcknowledgedSubtasks++
		tc.StateSize += a.Size
		tc.CheckpointedSize += a.Uploaded
		tc.LatestAckTimestamp = max(tc.LatestAckTimestamp, a.At.UnixMilli())
		tc.AlignmentDuration = max(tc.AlignmentDuration, a.Alignment.Milliseconds())
		tc.SyncDuration = max(tc.SyncDuration, a.Sync.Milliseconds())
		tc.AsyncDuration = max(tc.AsyncDuration, a.Async.Milliseconds())
	}
	if tc.LatestAckTimestamp > 0 {
		tc.EndToEndDuration = tc.LatestAckTimestamp - trigger
	}
	return tc
}

// subtasksOf is Flink's per-subtask statistics of vertex v in e.
func subtasksOf(e cpEntry, v runtime.GraphVertex) taskSubtasks {
	trigger := e.Triggered.UnixMilli()
	out := taskSubtasks{taskCheckpoint: vertexCheckpoint(e, v, trigger), Subtasks: []subtaskCheckpoint{}}
	var ends, sizes, uploaded, syncs, asyncs, aligns []int64
	for i, t := range v.Tasks {
		a, ok := e.Acks[t]
		if !ok {
			out.Subtasks = append(out.Subtasks, subtaskCheckpoint{Index: i, Status: "pending_or_failed"})
			continue
		}
		at, end := a.At.UnixMilli(), max(a.At.Sub(e.Triggered).Milliseconds(), 0)
		sync, async, align := a.Sync.Milliseconds(), a.Async.Milliseconds(), a.Alignment.Milliseconds()
		zero, no := int64(0), false
		out.Subtasks = append(out.Subtasks, subtaskCheckpoint{Index: i, Status: "completed", AckTimestamp: &at,
			EndToEndDuration: &end, StateSize: &a.Size, CheckpointedSize: &a.Uploaded,
			Checkpoint: &cpDurations[int64]{Sync: sync, Async: async},
			Alignment:  &cpAlignment[int64]{Duration: align}, StartDelay: &zero, UnalignedCheckpoint: &no, Aborted: &no})
		ends, sizes, uploaded = append(ends, end), append(sizes, a.Size), append(uploaded, a.Uploaded)
		syncs, asyncs, aligns = append(syncs, sync), append(asyncs, async), append(aligns, align)
	}
	zero := summarize(make([]int64, len(ends)))
	out.Summary = subtasksSummary{CheckpointedSize: summarize(uploaded), StateSize: summarize(sizes), EndToEndDuration: summarize(ends),
		CheckpointDuration: cpDurations[statsSummary]{Sync: summarize(syncs), Async: summarize(asyncs)},
		Alignment:          cpAlignment[statsSummary]{Buffered: zero, Processed: zero, Persisted: zero, Duration: summarize(aligns)},
		StartDelay:         zero, UnalignedCheckpoint: zero}
	return out
}

// summarize is Flink's StatsSummaryDto of values (all 0 without any).
func summarize(values []int64) statsSummary {
	if len(values) == 0 {
		return statsSummary{}
	}
	v := slices.Clone(values)
	slices.Sort(v)
	var sum int64
	for _, x := range v {
		sum += x
	}
	q := func(p float64) float64 {
		// nearest rank
		i := int(p*float64(len(v))+0.5) - 1
		return float64(v[min(max(i, 0), len(v)-1)])
	}
	return statsSummary{Min: v[0], Max: v[len(v)-1], Avg: sum / int64(len(v)), P50: q(0.5), P90: q(0.9), P95: q(0.95),
		P99: q(0.99), P999: q(0.999)}
}

func (s *Server) restCheckpoints(w http.ResponseWriter, r *http.Request) {
	n := historySize
	if q := r.URL.Query().Get("history"); q != "" {
		v, err := strconv.Atoi(q)
		if err != nil || v < 0 {
			restError(w, fmt.Errorf("%w: history=%q: want a count of checkpoints", errBadRequest, q))
			return
		}
		n = v
	}
	out, err := s.checkpointStats(r.Context(), r.PathValue("id"), n)
	if err != nil {
		restError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// jobGraph returns job id's graph (the running one, else rebuilt) and its
// subtask count.
func (s *Server) jobGraph(rec JobRecord) (runtime.Graph, int) {
	g, _, _ := s.graphOf(rec)
	n := 0
	for _, v := range g.Vertices {
		n += len(v.Tasks)
	}
	return g, n
}

// checkpointStats renders job id's checkpoint statistics with the newest
// n checkpoints of the history (at most historyKept): those this job
// manager saw, and the completed checkpoints its store retains beyond them
// (e.g. from before it started).
func (s *Server) checkpointStats(ctx context.Context, id string, n int) (cpResponse, error) {
	rec, err := s.jobs.store.Get(id)
	if err != nil {
		return cpResponse{}, err
	}
	graph, tasks := s.jobGraph(rec)
	var snap cpSnapshot
	if st := s.statsOf(id); st != nil {
		snap = st.snapshot()
	}
	out := cpResponse{History: []cpHistory{}, Counts: cpCounts{Restored: int64(snap.Restored), InProgress: snap.InProgress,
		Completed: int64(snap.Completed), Failed: int64(snap.Failed), Total: int64(snap.Completed + snap.Failed + snap.InProgress)}}
	sums, err := s.jobs.cps.List(ctx, id)
	if err != nil {
		return cpResponse{}, err
	}
	retained := map[checkpoint.ID]bool{}
	for _, c := range sums {
		if c.Err == nil {
			retained[c.ID] = true
		}
	}
	seen := map[uint64]bool{}
	var sizes, uploaded, durations, alignments []int64
	for _, e := range snap.History {
		h := historyOf(e, tasks, graph, false)
		if h.Discarded != nil {
			*h.Discarded = !retained[e.ID]
		}
		if e.Status == cpCompleted {
			sizes, uploaded, durations, alignments = append(sizes, h.StateSize), append(uploaded, h.CheckpointedSize), append(durations, h.EndToEndDuration), append(alignments, h.AlignmentDuration)
		}
		out.History = append(out.History, h)
		seen[uint64(e.ID)] = true
	}
	for _, c := range sums {
		if c.Err != nil || seen[uint64(c.ID)] {
			continue
		}
		h := historyOf(cpEntry{ID: c.ID, Status: cpCompleted, Triggered: c.TriggeredAt, Ended: c.CompletedAt, Size: c.Size, Uploaded: c.Size}, tasks, graph, false)
		h.EndToEndDuration = c.Duration.Milliseconds()
		out.History = append(out.History, h)
	}
	sort.Slice(out.History, func(i, j int) bool { return out.History[i].ID > out.History[j].ID })
	for i := range out.History {
		if h := &out.History[i]; h.Status == cpCompleted {
			c := *h
			out.Latest.Completed = &c
			break
		}
	}
	out.History = out.History[:min(n, len(out.History))]
	zero := summarize(make([]int64, len(sizes)))
	out.Summary = cpSummary{CheckpointedSize: summarize(uploaded), StateSize: summarize(sizes), EndToEndDuration: summarize(durations),
		AlignmentBuffered: zero, ProcessedData: zero, PersistedData: zero, AlignmentDuration: summarize(alignments)}
	if snap.LastFailed != nil {
		f := historyOf(*snap.LastFailed, tasks, graph, false)
		out.Latest.Failed = &f
	}
	if snap.LastRestore != nil {
		out.Latest.Restored = &cpRestored{ID: uint64(snap.LastRestore.ID), RestoreTimestamp: snap.LastRestore.At.UnixMilli(),
			ExternalPath: notExternallyAddressable}
		// The savepoint the job was submitted from is its first completed
		// checkpoint (imported at submit): restoring it is restoring the
		// savepoint, whose path is external.
		if rec.FromSavepoint != "" && snap.LastRestore.ID == rec.FromSavepointCheckpoint {
			out.Latest.Restored.IsSavepoint, out.Latest.Restored.ExternalPath = true, rec.FromSavepoint
		}
	}
	return out, nil
}

// restCheckpointDetails is Flink's GET .../checkpoints/details/{cid}: one
// checkpoint of the recent history (historySize), with its tasks.
func (s *Server) restCheckpointDetails(w http.ResponseWriter, r *http.Request) {
	rec, e, ok := s.recentCheckpoint(w, r)
	if !ok {
		return
	}
	graph, tasks := s.jobGraph(rec)
	writeJSON(w, http.StatusOK, historyOf(e, tasks, graph, true))
}

// restCheckpointSubtasks is Flink's GET
// .../checkpoints/details/{cid}/subtasks/{vid}: one vertex's part of one
// checkpoint of the recent history, subtask by subtask, with each
// subtask's synchronous and asynchronous snapshot durations.
func (s *Server) restCheckpointSubtasks(w http.ResponseWriter, r *http.Request) {
	rec, e, ok := s.recentCheckpoint(w, r)
	if !ok {
		return
	}
	graph, _ := s.jobGraph(rec)
	vid := r.PathValue("vid")
	i := slices.IndexFunc(graph.Vertices, func(v runtime.GraphVertex) bool { return v.ID == vid })
	if i < 0 {
		restError(w, fmt.Errorf("%w: job %s has no vertex %q", errNotFound, rec.ID, vid))
		return
	}
	writeJSON(w, http.StatusOK, subtasksOf(e, graph.Vertices[i]))
}

// recentCheckpoint finds the checkpoint {cid} of the job {id} among its
// last historySize, for the checkpoint details routes; when it is not
// there (or the request is malformed) it writes the error and returns
// false.
func (s *Server) recentCheckpoint(w http.ResponseWriter, r *http.Request) (JobRecord, cpEntry, bool) {
	id := r.PathValue("id")
	rec, err := s.jobs.store.Get(id)
	if err != nil {
		restError(w, err)
		return JobRecord{}, cpEntry{}, false
	}
	cid, err := strconv.ParseUint(r.PathValue("cid"), 10, 64)
	if err != nil {
		restError(w, fmt.Errorf("%w: checkpoint id %q is not a number", errBadRequest, r.PathValue("cid")))
		return JobRecord{}, cpEntry{}, false
	}
	if st := s.statsOf(id); st != nil {
		for i, e := range st.snapshot().History {
			if uint64(e.ID) == cid && i < historySize {
				return rec, e, true
			}
		}
	}
	restError(w, fmt.Errorf("%w: checkpoint %d of job %s is not among its last %d", errNotFound, cid, id, historySize))
	return JobRecord{}, cpEntry{}, false
}

// cpConfig is Flink's CheckpointConfigInfo.
type cpConfig struct {
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

// restCheckpointConfig is Flink's GET .../checkpoints/config: how the job
// manager checkpoints the job (aligned barriers, exactly once, one at a
// time, the job's checkpoint timeout, else the job manager's, the default
// minimum pause).
func (s *Server) restCheckpointConfig(w http.ResponseWriter, r *http.Request) {
	rec, err := s.jobs.store.Get(r.PathValue("id"))
	if err != nil {
		restError(w, err)
		return
	}
	c := cpConfig{Mode: "exactly_once", Interval: rec.CheckpointIntervalMs, Timeout: s.cpTimeout(rec).Milliseconds(),
		MinPause:      checkpoint.EffectiveMinPause(0, time.Duration(rec.CheckpointIntervalMs)*time.Millisecond).Milliseconds(),
		MaxConcurrent: 1, StateBackend: "weir", CheckpointStorage: "jobmanager", TolerableFailedCheckpoints: checkpoint.DefaultTolerableFailures,
		CheckpointsAfterTasksFinish: true}
	c.Externalization.Enabled = true
	c.Externalization.DeleteOnCancellation = !rec.RetainOnCancel
	writeJSON(w, http.StatusOK, c)
}

func (s *Server) statsOf(id string) *cpStats {
	s.jobs.mu.Lock()
	defer s.jobs.mu.Unlock()
	return s.jobs.stats[id]
}
