package checkpoint

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/weirstream/weir/checkpoint/storage"
)

// LatestReader is where WriteRetained reads a job's latest checkpoint
// from: a Store, or any storage that answers as Store.LatestUsable does.
type LatestReader interface {
	LatestUsable(ctx context.Context, job string) (Completed, []Skipped, error)
}

// WriteRetained writes the latest usable completed checkpoint of job in
// from out as a savepoint (Flink's retained externalized checkpoint of a
// cancelled job), into a new location RetainedName(job, id) under base (a
// directory or a savepoint URL, JoinSavepointLocation), and returns that
// location (absolute, for a directory) and the checkpoint. A job that completed
// no checkpoint gives an error wrapping ErrNotFound. opts are
// WriteSavepoint's.
func WriteRetained(ctx context.Context, from LatestReader, job, base string, now time.Time, opts ...SavepointOpt) (string, Completed, error) {
	c, _, err := from.LatestUsable(ctx, job)
	if err != nil {
		return "", Completed{}, fmt.Errorf("retain the latest checkpoint of job %s: %w", job, err)
	}
	dir, err := JoinSavepointLocation(base, RetainedName(job, c.ID))
	if err != nil {
		return "", Completed{}, fmt.Errorf("retain the latest checkpoint of job %s: %w", job, err)
	}
	if err := WriteSavepoint(ctx, dir, c, now, opts...); err != nil {
		return "", Completed{}, err
	}
	return dir, c, nil
}

// RetainedName is the directory name of job's checkpoint id retained as a
// savepoint: "retained-", the start of the job id (ShortJobID), "-" and
// the id.
func RetainedName(job string, id ID) string {
	return "retained-" + ShortJobID(job) + "-" + strconv.FormatUint(uint64(id), 10)
}

// ShortJobID is the start of a job id that names its savepoint
// directories (as Flink's savepoint-<6 characters of the job id>-...).
func ShortJobID(id string) string {
	if len(id) > 6 {
		return id[:6]
	}
	return id
}

// Resolving returns a LatestReader that reads from and then reads the state
// the checkpoint references in checkpoint storage st back in (Resolve), so
// that what WriteRetained writes is self-contained. st may be nil when the
// checkpoints reference nothing.
func Resolving(from LatestReader, st storage.Storage, opts ...ResolveOpt) LatestReader {
	return resolving{from, st, opts}
}

type resolving struct {
	from LatestReader
	st   storage.Storage
	opts []ResolveOpt
}

func (r resolving) LatestUsable(ctx context.Context, job string) (Completed, []Skipped, error) {
	c, skipped, err := r.from.LatestUsable(ctx, job)
	if err == nil {
		c, err = Resolve(ctx, r.st, c, r.opts...)
	}
	return c, skipped, err
}
