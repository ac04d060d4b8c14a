package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
)

// A bounded source (StopAt(Latest())) reads every partition to the offset
// it had at the start, ends its input, and the job FINISHES: the sink's
// last transaction commits, so the output holds every input record once,
// and records written after the start are not read.
func TestBoundedJobFinishesAndCommitsItsOutput(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 4, nil)
	env.CreateTopic(t, "out", 2, nil)
	produce(t, env, "in", 4, 0, 2000, "r", nil)
	j := copyJob(t, env, "bounded", "in", "out", 3, StopAt(Latest()))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	mc := runtime.NewMiniCluster(runtime.CheckpointInterval(200 * time.Millisecond))
	if _, err := mc.Run(ctx, j); err != nil {
		t.Fatalf("a bounded job must finish: %v", err)
	}
	sameSet(t, values(t, env, "out"), names("r", 0, 2000))
}
