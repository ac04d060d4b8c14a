package jobmanager

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/runtime"
)

// JobState is a job's lifecycle state as streamctl status shows it.
type JobState string

// Job states.
const (
	StateCreated    JobState = "CREATED"
	StateRunning    JobState = "RUNNING"
	StateRestarting JobState = "RESTARTING"
	StateFailed     JobState = "FAILED"
	StateCanceled   JobState = "CANCELED"
	StateFinished   JobState = "FINISHED"
)

// JobRecord is what the job store keeps of one submitted job: enough to
// build it again (every node runs the same binary) after a job manager
// restart.
type JobRecord struct {
	ID   string `json:"id"`
	Type string `json:"type"`
	// Name is the name the user gave the job at submit (empty: none; the
	// job is then shown by its type, see DisplayName).
	Name                 string            `json:"name,omitempty"`
	Params               map[string]string `json:"params"`
	CheckpointIntervalMs int64             `json:"checkpoint_interval_ms"`
	// CheckpointTimeoutMs is the job's own checkpoint timeout (0: the job
	// manager's, CheckpointTimeout).
	CheckpointTimeoutMs int64  `json:"checkpoint_timeout_ms,omitempty"`
	RestartStrategy     string `json:"restart_strategy,omitempty"`
	SubmittedUnixMs     int64  `json:"submitted_unix_ms,omitempty"`
	// FromSavepoint is the savepoint the job was submitted from (its
	// state was imported into the checkpoint store at submit), and
	// AllowNonRestoredState whether it may drop state of operators the
	// job no longer has.
	FromSavepoint         string `json:"from_savepoint,omitempty"`
	AllowNonRestoredState bool   `json:"allow_non_restored_state,omitempty"`
	// FromSavepointCheckpoint is the savepoint's checkpoint id: the job's
	// first completed checkpoint, which a restore of it restores (REST's
	// latest.restored then says is_savepoint and names FromSavepoint).
	FromSavepointCheckpoint checkpoint.ID `json:"from_savepoint_checkpoint,omitempty"`
	// RetainOnCancel: a cancel writes the job's latest completed
	// checkpoint out as a savepoint, RetainedSavepoint.
	RetainOnCancel    bool   `json:"retain_on_cancel,omitempty"`
	RetainedSavepoint string `json:"retained_savepoint,omitempty"`
	// LastCheckpoint is the last completed checkpoint of a cancelled job
	// whose checkpoints were deleted (it is no longer in the checkpoint
	// store; status still shows it).
	LastCheckpoint checkpoint.ID `json:"last_checkpoint,omitempty"`
	State          JobState      `json:"state"`
	// ChangedUnixMs is when the job last changed state (Flink's
	// last-modification); 0 in records written before it was kept.
	ChangedUnixMs int64  `json:"changed_unix_ms,omitempty"`
	Restarts      int    `json:"restarts"`
	Error         string `json:"error,omitempty"`
	// Exceptions are the job's latest failures, oldest first, at most
	// ExceptionHistorySize of them; ExceptionsTruncated says older ones
	// were dropped.
	Exceptions          []JobException `json:"exceptions,omitempty"`
	ExceptionsTruncated bool           `json:"exceptions_truncated,omitempty"`
	// Records are what the running attempt's sources emitted and its sinks
	// wrote, as of the task managers' last heartbeats; a job that ended
	// keeps those of its last attempt.
	Records runtime.RecordCounts `json:"records"`
	// Waiting says why a CREATED or RESTARTING job is not running yet
	// ("waiting for 2 slots, 1 free"; not stored: it is known while the
	// job waits).
	Waiting string `json:"-"`
	// NextAttemptUnixMs is when a RESTARTING job's next attempt starts,
	// the restart strategy's delay over (0: not waiting for one; not
	// stored: it is known while the job waits).
	NextAttemptUnixMs int64 `json:"-"`
	// RestoredFrom is the checkpoint the running attempt restored (not
	// stored: it is known while the job runs).
	RestoredFrom checkpoint.ID `json:"-"`
}

// DisplayName is the job's name as list, status and REST show it: the
// name given at submit, or else its type.
func (r JobRecord) DisplayName() string {
	if r.Name != "" {
		return r.Name
	}
	return r.Type
}

// ExceptionHistorySize bounds a job's exception history, as Flink's
// web.exception-history-size (default 16).
const ExceptionHistorySize = 16

// JobException is one failure of a job: what failed an attempt (the job
// restarted) or the job itself.
type JobException struct {
	// UnixMs is when the job manager saw the failure.
	UnixMs int64 `json:"unix_ms"`
	// Message is the error's text.
	Message string `json:"message"`
	// Task names the failed subtask as Flink does ("name (2/4)"; empty
	// when the failure is not a task's, e.g. a checkpoint failure).
	Task string `json:"task,omitempty"`
	// TaskManager is the task manager the failed task ran on (empty when
	// unknown).
	TaskManager string `json:"task_manager,omitempty"`
	// Restarted says the job restarted after this failure; false: the
	// failure ended the job.
	Restarted bool `json:"restarted"`
}

// addException appends e to r's history, dropping the oldest beyond
// ExceptionHistorySize.
func (r *JobRecord) addException(e JobException) {
	r.Exceptions = append(r.Exceptions, e)
	if n := len(r.Exceptions) - ExceptionHistorySize; n > 0 {
		r.Exceptions = append([]JobException(nil), r.Exceptions[n:]...)
		r.ExceptionsTruncated = true
	}
}

// LastException is the job's latest failure (nil if none).
func (r JobRecord) LastException() *JobException {
	if len(r.Exceptions) == 0 {
		return nil
	}
	e := r.Exceptions[len(r.Exceptions)-1]
	return &e
}

// ErrJobNotFound is returned for a job id the store does not hold.
var ErrJobNotFound = errors.New("no such job")

// JobStore keeps job records in pebble; every write is synced, so a job
// manager restarted on the same directory finds every job it acknowledged.
type JobStore struct {
	db *pebble.DB
}

const jobKeyPrefix = "job/"

// OpenJobStore opens (creating) the job store in dir; an empty dir keeps it
// in memory.
func OpenJobStore(dir string) (*JobStore, error) {
	opts := &pebble.Options{Logger: quietPebble{}}
	if dir == "" {
		dir, opts.FS = "jobs", vfs.NewMem()
	}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		return nil, fmt.Errorf("open job store: %w", err)
	}
	return &JobStore{db: db}, nil
}

// Close closes the store.
func (s *JobStore) Close() error { return s.db.Close() }

// NewJobID returns a fresh random job id (32 hex digits, as Flink's).
func NewJobID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("job id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// Put writes r durably.
func (s *JobStore) Put(r JobRecord) error {
	if r.ID == "" {
		return errors.New("job record without an id")
	}
	v, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode job %s: %w", r.ID, err)
	}
	if err := s.db.Set([]byte(jobKeyPrefix+r.ID), v, pebble.Sync); err != nil {
		return fmt.Errorf("store job %s: %w", r.ID, err)
	}
	return nil
}

// Get reads the record of job id (ErrJobNotFound if none).
func (s *JobStore) Get(id string) (JobRecord, error) {
	v, closer, err := s.db.Get([]byte(jobKeyPrefix + id))
	if errors.Is(err, pebble.ErrNotFound) {
		return JobRecord{}, fmt.Errorf("%w: %s", ErrJobNotFound, id)
	}
	if err != nil {
		return JobRecord{}, fmt.Errorf("read job %s: %w", id, err)
	}
	defer closer.Close()
	var r JobRecord
	if err := json.Unmarshal(v, &r); err != nil {
		return JobRecord{}, fmt.Errorf("decode job %s: %w", id, err)
	}
	return r, nil
}

// List returns every job record, by id.
func (s *JobStore) List() ([]JobRecord, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte(jobKeyPrefix), UpperBound: []byte("job0")})
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	var out []JobRecord
	for it.First(); it.Valid(); it.Next() {
		var r JobRecord
		if err := json.Unmarshal(it.Value(), &r); err != nil {
			it.Close()
			return nil, fmt.Errorf("decode job %s: %w", it.Key(), err)
		}
		out = append(out, r)
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// quietPebble drops pebble's routine messages; a fatal one panics as
// pebble's default logger would exit.
type quietPebble struct{}

func (quietPebble) Infof(string, ...any)  {}
func (quietPebble) Errorf(string, ...any) {}
func (quietPebble) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf("pebble: "+format, args...))
}
