package jobmanager

import (
	"maps"
	"sort"
	"sync"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/runtime"
)

// Checkpoint statistics (docs/metrics.md): what the REST API's
// /jobs/{id}/checkpoints and the Prometheus checkpoint metrics report,
// kept in memory per job as Flink's CheckpointStatsTracker does, fed by
// runtime's checkpoint hooks. They count what happened since this job
// manager started the job; the checkpoint store holds what survives it.

// historySize is how many recent checkpoints GET /jobs/{id}/checkpoints
// lists by default (Flink's web.checkpoints.history default); only these
// keep their tasks' acknowledgements (GET .../checkpoints/details/{cid}).
const historySize = 10

// historyKept bounds the history kept per job: what ?history=N may ask for,
// so the dashboard can chart minutes of checkpoints at short intervals
// (2000 checkpoints are 6-7 minutes at 200 ms, 33 at 1 s).
const historyKept = 2000

// Checkpoint states in the history, Flink's names.
const (
	cpInProgress = "IN_PROGRESS"
	cpCompleted  = "COMPLETED"
	cpFailed     = "FAILED"
)

// cpEntry is one checkpoint of the history.
type cpEntry struct {
	ID        checkpoint.ID
	Status    string
	Triggered time.Time
	Ended     time.Time // completed or failed; zero in progress
	// Size is the checkpoint's full state size; Uploaded the part it
	// added (inline, or written to checkpoint storage for it: Flink's
	// checkpointed size, less than Size for incremental checkpoints).
	Size     int64
	Uploaded int64
	Failure  string
	// Acked counts the tasks that acknowledged it, LatestAck is the last
	// acknowledgement, Alignment the longest barrier alignment among them,
	// Sync and Async the longest synchronous and asynchronous snapshot
	// parts.
	Acked       int
	LatestAck   time.Time
	Alignment   time.Duration
	Sync, Async time.Duration
	// Acks are the tasks' acknowledgements; dropped once the entry is
	// older than the newest historySize.
	Acks map[checkpoint.TaskID]runtime.CheckpointAck
}

// cpRestore is a restore of the job from a checkpoint.
type cpRestore struct {
	ID checkpoint.ID
	At time.Time
}

// cpStats tracks one job's checkpoints.
type cpStats struct {
	mu                          sync.Mutex
	completed, failed, restored int
	history                     []*cpEntry // oldest first, at most historySize
	byID                        map[checkpoint.ID]*cpEntry
	inProgress                  map[checkpoint.ID]*cpEntry
	lastCompleted, lastFailed   *cpEntry
	lastRestore                 *cpRestore
	// deleted counts objects deleted from checkpoint storage.
	deleted int64
	// stopped is when the job stopped here (finished, failed, cancelled,
	// suspended); zero while it runs.
	stopped time.Time
}

func (s *cpStats) stopTime() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopped
}

func newCPStats() *cpStats {
	return &cpStats{byID: map[checkpoint.ID]*cpEntry{}, inProgress: map[checkpoint.ID]*cpEntry{}}
}

// entryLocked returns id's entry, adding it to the history if it is new.
func (s *cpStats) entryLocked(id checkpoint.ID, triggered time.Time) *cpEntry {
	if e := s.byID[id]; e != nil {
		return e
	}
	e := &cpEntry{ID: id, Status: cpInProgress, Triggered: triggered, Acks: map[checkpoint.TaskID]runtime.CheckpointAck{}}
	s.byID[id] = e
	s.history = append(s.history, e)
	if len(s.history) > historyKept {
		delete(s.byID, s.history[0].ID)
		s.history[0] = nil
		s.history = s.history[1:]
	}
	if n := len(s.history) - historySize - 1; n >= 0 {
		s.history[n].Acks = nil
	}
	return e
}

func (s *cpStats) triggered(ev runtime.CheckpointEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entryLocked(ev.ID, ev.Triggered)
	if e.Triggered.IsZero() {
		e.Triggered = ev.Triggered // an acknowledgement came first
	}
	if e.Status == cpInProgress {
		s.inProgress[ev.ID] = e
	}
}

// acked records a task's acknowledgement of a checkpoint.
func (s *cpStats) acked(a runtime.CheckpointAck) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entryLocked(a.ID, time.Time{})
	if e.Acks != nil {
		if _, dup := e.Acks[a.Task]; dup {
			return
		}
		e.Acks[a.Task] = a
	}
	e.Acked++
	e.LatestAck = a.At
	e.Alignment = max(e.Alignment, a.Alignment)
	e.Sync, e.Async = max(e.Sync, a.Sync), max(e.Async, a.Async)
}

func (s *cpStats) completedCheckpoint(ev runtime.CheckpointEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entryLocked(ev.ID, ev.Triggered)
	delete(s.inProgress, ev.ID)
	e.Status, e.Ended, e.Size, e.Uploaded = cpCompleted, time.Now(), ev.Size, ev.Uploaded
	if e.Triggered.IsZero() {
		e.Triggered = e.Ended.Add(-ev.Cycle)
	}
	s.completed++
	s.lastCompleted = e
}

// stateDeleted counts objects deleted from checkpoint storage.
func (s *cpStats) stateDeleted(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deleted += int64(n)
}

func (s *cpStats) abortedCheckpoint(ev runtime.CheckpointEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entryLocked(ev.ID, ev.Triggered)
	delete(s.inProgress, ev.ID)
	s.failLocked(e, ev.Err)
}

func (s *cpStats) failLocked(e *cpEntry, err error) {
	e.Status, e.Ended = cpFailed, time.Now()
	if err != nil {
		e.Failure = err.Error()
	}
	s.failed++
	s.lastFailed = e
}

// restart fails the checkpoints in progress: their attempt is over.
func (s *cpStats) restart(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endAttemptLocked(cause)
}

// ended fails the checkpoints in progress when the job stopped.
func (s *cpStats) ended(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = time.Now()
	s.endAttemptLocked(cause)
}

func (s *cpStats) endAttemptLocked(cause error) {
	ids := make([]checkpoint.ID, 0, len(s.inProgress))
	for id := range s.inProgress {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		s.failLocked(s.inProgress[id], cause)
		delete(s.inProgress, id)
	}
}

func (s *cpStats) restoredFrom(from checkpoint.ID) {
	if from == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.restored++
	s.lastRestore = &cpRestore{ID: from, At: time.Now()}
}

// taskTimes returns the longest synchronous and asynchronous snapshot
// parts among checkpoint id's acknowledgements, if this job manager saw
// them.
func (s *cpStats) taskTimes(id checkpoint.ID) (sync, async time.Duration, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.byID[id]
	if e == nil || e.Acked == 0 {
		return 0, 0, false
	}
	return e.Sync, e.Async, true
}

// cpSnapshot is a consistent copy of a job's checkpoint statistics.
type cpSnapshot struct {
	Completed, Failed, InProgress, Restored int
	Deleted                                 int64     // objects deleted from checkpoint storage
	History                                 []cpEntry // newest first
	LastCompleted, LastFailed               *cpEntry
	LastRestore                             *cpRestore
}

func (s *cpStats) snapshot() cpSnapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := cpSnapshot{Completed: s.completed, Failed: s.failed, InProgress: len(s.inProgress), Restored: s.restored, Deleted: s.deleted}
	for i := len(s.history) - 1; i >= 0; i-- {
		e := *s.history[i]
		e.Acks = maps.Clone(e.Acks)
		out.History = append(out.History, e)
	}
	if s.lastCompleted != nil {
		c := *s.lastCompleted
		out.LastCompleted = &c
	}
	if s.lastFailed != nil {
		f := *s.lastFailed
		out.LastFailed = &f
	}
	if s.lastRestore != nil {
		r := *s.lastRestore
		out.LastRestore = &r
	}
	return out
}
