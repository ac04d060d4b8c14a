package sharegroup

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// waitPending polls s (the source's housekeeping runs in Poll) until its
// pendingRecords equal want, and fails the test after 30s.
func waitPending(t *testing.T, s *Source[string], want map[acklog.TopicPartition]int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := s.pendingRecords()
		if fmt.Sprint(got) == fmt.Sprint(want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pendingRecords %v, want %v", got, want)
		}
		pollFor(t, s, 1, 100*time.Millisecond)
	}
}

// Subtask 0 measures Flink's pendingRecords per input partition, the log
// end offset minus the share partition's start offset: records the group
// holds but has not acknowledged are pending; once their checkpoint
// completes (the records are ACCEPTed and the start offset moves past
// them) they are not. Another subtask reports none (subtask 0 speaks for
// the group).
func TestPendingRecordsAreTheLogEndMinusTheShareStartOffset(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", 10)
	fast := withCfg(func(c *cfg) { c.checkEvery = 50 * time.Millisecond })
	a := openSource(t, env, 0, nil, fast)
	if got := pollFor(t, a, 10, 10*time.Second); len(got) != 10 {
		t.Fatalf("got %d records, want 10", len(got))
	}
	in0 := acklog.TopicPartition{Topic: "in", Partition: 0}
	retry := acklog.TopicPartition{Topic: a.cfg.requeueTopic, Partition: 0} // the source's re-queue topic is an input too
	// Held, not acknowledged: all ten are pending.
	waitPending(t, a, map[acklog.TopicPartition]int64{in0: 10, retry: 0})

	if _, err := a.Snapshot(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if err := a.NotifyCheckpointComplete(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	waitPending(t, a, map[acklog.TopicPartition]int64{in0: 0, retry: 0})

	// Five more: pending, read or not, until they are acknowledged.
	produceN(t, env, "in", 5)
	waitPending(t, a, map[acklog.TopicPartition]int64{in0: 5, retry: 0})

	b := openSource(t, env, 1, nil, fast)
	pollFor(t, b, 1, 500*time.Millisecond)
	if got := b.pendingRecords(); got != nil {
		t.Errorf("subtask 1 reports pendingRecords %v, want none", got)
	}
}
