package jobmanager

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// ReadJobRecord reads the record of job id from the job store in dir (a
// job manager's <data-dir>/jobs) opened read-only, without a running job
// manager: what streamctl savepoint inspect and state dump learn a
// retained checkpoint's job type and parameters from. A job store a job
// manager has open fails (pebble locks its directory even for readers).
func ReadJobRecord(dir, id string) (JobRecord, error) {
	db, err := pebble.Open(dir, &pebble.Options{Logger: quietPebble{}, ReadOnly: true})
	if err != nil {
		return JobRecord{}, fmt.Errorf("open job store %s read-only: %w", dir, err)
	}
	s := &JobStore{db: db}
	defer s.Close()
	return s.Get(id)
}
