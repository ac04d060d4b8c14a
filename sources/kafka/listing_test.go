package kafka

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
)

// A broker whose offsets listing lacks a partition (as one just restarted
// can answer, its metadata naming fewer partitions) must not stop a bounded
// source's partition at offset 0: the listing is asked again, and every
// record is read, exactly once.
func TestAPartitionMissingFromTheOffsetsListingIsListedAgainNotEndedAtZero(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 4, nil)
	env.CreateTopic(t, "out", 1, nil)
	const n = 4000
	produce(t, env, "in", 4, 0, n, "r", nil)
	c := env.Broker.Cluster()
	var answered atomic.Int32
	c.ControlKey(kmsg.ListOffsets.Int16(), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kr.(*kmsg.ListOffsetsRequest)
		// The first two last-stable listings (read_committed) of "in"
		// lack partition 3; every partition holds n/4 records. The
		// listings of "out" (the check's read below) are the broker's.
		if req.IsolationLevel != 1 || len(req.Topics) != 1 || req.Topics[0].Topic != "in" || answered.Add(1) > 2 {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
		resp.Version = req.Version
		for _, rt := range req.Topics {
			st := kmsg.NewListOffsetsResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				if rp.Partition == 3 {
					continue
				}
				sp := kmsg.NewListOffsetsResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.Offset = n / 4
				sp.Timestamp = -1
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	j := copyJob(t, env, "listing", "in", "out", 1, StopAt(Latest()))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if _, err := runtime.NewMiniCluster(runtime.CheckpointInterval(50*time.Millisecond)).Run(ctx, j); err != nil {
		t.Fatal(err)
	}
	sameSet(t, values(t, env, "out"), names("r", 0, n))
	if answered.Load() < 2 {
		t.Errorf("the listing lacking partition 3 was answered %d times, want it asked again after the first", answered.Load())
	}
}

// A start and a stop at timestamps cost one offsets listing each, for
// every partition at once, not one per partition (a topic of hundreds of
// partitions would otherwise be listed hundreds of times at every start).
func TestTimestampOffsetsAreListedOncePerTimestampNotPerPartition(t *testing.T) {
	env := kafkatest.New(t)
	const parts = 8
	env.CreateTopic(t, "in", parts, nil)
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	// Record i is in partition i mod 8, stamped base + i seconds.
	produce(t, env, "in", parts, 0, 80, "r", func(i int) int64 { return base.Add(time.Duration(i) * time.Second).UnixMilli() })
	c := env.Broker.Cluster()
	var listings atomic.Int32
	c.ControlKey(kmsg.ListOffsets.Int16(), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, rt := range kr.(*kmsg.ListOffsetsRequest).Topics {
			if len(rt.Partitions) > 0 && rt.Partitions[0].Timestamp >= 0 {
				listings.Add(1)
			}
		}
		return nil, nil, false
	})
	s, err := openSource(t, env, nil, Topics("in"), StartAt(AtTimestamp(base.Add(16*time.Second))),
		StopAt(AtTimestamp(base.Add(64*time.Second))))
	if err != nil {
		t.Fatal(err)
	}
	sameSet(t, pollAll(t, s), names("r", 16, 48))
	if n := listings.Load(); n != 2 {
		t.Errorf("%d timestamp listings of %d partitions, want 2 (one for the start, one for the stop)", n, parts)
	}
}
