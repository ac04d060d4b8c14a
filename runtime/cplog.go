package runtime

import (
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
)

// checkpointSummaryEvery is how often, at most, a job logs its checkpoint
// summary at info level.
const checkpointSummaryEvery = time.Minute

// checkpointSummary keeps routine checkpoint logs out of the info level: a
// job checkpointing every second would otherwise write little else. Each
// completion is logged at debug level; at info, one line sums up the
// completions of each window of checkpointSummaryEvery (logged at the first
// completion past the window, and at the end of the run).
type checkpointSummary struct {
	log   *zap.Logger
	job   string
	every time.Duration

	mu     sync.Mutex
	start  time.Time // of the window
	n      int
	last   checkpoint.ID
	total  time.Duration
	slow   time.Duration
	lastSz int64
}

func newCheckpointSummary(log *zap.Logger, job string, every time.Duration, now time.Time) *checkpointSummary {
	return &checkpointSummary{log: log, job: job, every: every, start: now}
}

// completed notes that checkpoint id completed at now after cycle, with
// size bytes of state.
func (s *checkpointSummary) completed(now time.Time, id checkpoint.ID, cycle time.Duration, size int64) {
	s.log.Debug("checkpoint completed", zap.String("job", s.job), zap.Uint64("checkpoint", uint64(id)),
		zap.Duration("duration", cycle), zap.Int64("size_bytes", size))
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	s.last, s.lastSz = id, size
	s.total += cycle
	s.slow = max(s.slow, cycle)
	if now.Sub(s.start) >= s.every {
		s.flushLocked(now)
	}
}

// flush logs the summary of the current window if a checkpoint completed in
// it, and starts a new window.
func (s *checkpointSummary) flush(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushLocked(now)
}

func (s *checkpointSummary) flushLocked(now time.Time) {
	if s.n > 0 {
		s.log.Info("checkpoints completed", zap.String("job", s.job), zap.Int("completed", s.n),
			zap.Duration("over", now.Sub(s.start)), zap.Uint64("last_checkpoint", uint64(s.last)),
			zap.Duration("duration_avg", s.total/time.Duration(s.n)), zap.Duration("duration_max", s.slow),
			zap.Int64("last_size_bytes", s.lastSz))
	}
	s.start, s.n, s.total, s.slow = now, 0, 0, 0
}
