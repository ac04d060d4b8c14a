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
	ID                   string            `json:"id"`
	Type                 string            `json:"type"`
	Params               map[string]string `json:"params"`
	CheckpointIntervalMs int64             `json:"checkpoint_interval_ms"`
	RestartStrategy      string            `json:"restart_strategy,omitempty"`
	SubmittedUnixMs      int64             `json:"submitted_unix_ms,omitempty"`
	State                JobState          `json:"state"`
	// ChangedUnixMs is when the job last changed state (Flink's
	// last-modification); 0 in records written before it was kept.
	ChangedUnixMs int64  `json:"changed_unix_ms,omitempty"`
	Restarts      int    `json:"restarts"`
	Error         string `json:"error,omitempty"`
	// RestoredFrom is the checkpoint the running attempt restored (not
	// stored: it is known while the job runs).
	RestoredFrom checkpoint.ID `json:"-"`
	// Records are what the running attempt's sources emitted and its sinks
	// wrote, as of the task managers' last heartbeats (not stored).
	Records runtime.RecordCounts `json:"-"`
}

// ErrJobNotFound is returned for a job id the store does not hold.
var ErrJobNotFound = errors.New("jobmanager: no such job")

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
		return nil, fmt.Errorf("jobmanager: open job store: %w", err)
	}
	return &JobStore{db: db}, nil
}

// Close closes the store.
func (s *JobStore) Close() error { return s.db.Close() }

// NewJobID returns a fresh random job id (32 hex digits, as Flink's).
func NewJobID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("jobmanager: job id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// Put writes r durably.
func (s *JobStore) Put(r JobRecord) error {
	if r.ID == "" {
		return errors.New("jobmanager: job record without an id")
	}
	v, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("jobmanager: encode job %s: %w", r.ID, err)
	}
	if err := s.db.Set([]byte(jobKeyPrefix+r.ID), v, pebble.Sync); err != nil {
		return fmt.Errorf("jobmanager: store job %s: %w", r.ID, err)
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
		return JobRecord{}, fmt.Errorf("jobmanager: read job %s: %w", id, err)
	}
	defer closer.Close()
	var r JobRecord
	if err := json.Unmarshal(v, &r); err != nil {
		return JobRecord{}, fmt.Errorf("jobmanager: decode job %s: %w", id, err)
	}
	return r, nil
}

// List returns every job record, by id.
func (s *JobStore) List() ([]JobRecord, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte(jobKeyPrefix), UpperBound: []byte("job0")})
	if err != nil {
		return nil, fmt.Errorf("jobmanager: list jobs: %w", err)
	}
	var out []JobRecord
	for it.First(); it.Valid(); it.Next() {
		var r JobRecord
		if err := json.Unmarshal(it.Value(), &r); err != nil {
			it.Close()
			return nil, fmt.Errorf("jobmanager: decode job %s: %w", it.Key(), err)
		}
		out = append(out, r)
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("jobmanager: list jobs: %w", err)
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
