package kafka

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/internal/deadletter"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
)

// sliceCollector collects what a source emits.
type sliceCollector struct{ vals []string }

func (c *sliceCollector) Collect(v string) { c.vals = append(c.vals, v) }

// openSource opens subtask 0 of 1 of a source on in, closed on cleanup.
func openSource(t *testing.T, env *kafkatest.Env, restored [][]byte, opts ...Opt) (*Source[string], error) {
	t.Helper()
	f, err := New(decodeString, append([]Opt{Brokers(env.Addr), DiscoveryInterval(100 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	s := f().(*Source[string])
	t.Cleanup(func() { _ = s.Close() })
	oc := &runtime.OperatorContext{Job: "j", UID: "src", Parallelism: 1, Restored: restored}
	if len(restored) > 0 {
		oc.RestoredFrom = 1
	}
	return s, s.Open(t.Context(), oc)
}

// pollUntil polls s until it emitted n records (or failed, or ended).
func pollUntil(t *testing.T, s *Source[string], n int) ([]string, error) {
	t.Helper()
	c := &sliceCollector{}
	for deadline := time.Now().Add(time.Minute); len(c.vals) < n; {
		if err := s.Poll(t.Context(), c); err != nil {
			return c.vals, err
		}
		if time.Now().After(deadline) {
			t.Fatalf("emitted %d records in a minute, want %d", len(c.vals), n)
		}
	}
	return c.vals, nil
}

// A client option that would read records of open and aborted
// transactions is refused when the source opens, naming the cause.
func TestReadUncommittedClientOptionIsRefused(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 1, nil)
	_, err := openSource(t, env, nil, Topics("in"), ClientOpts(kgo.FetchIsolationLevel(kgo.ReadUncommitted())))
	if !errors.Is(err, ErrReadUncommitted) || !runtime.IsUnrecoverable(err) {
		t.Fatalf("Open with read_uncommitted: %v; want an unrecoverable error wrapping ErrReadUncommitted", err)
	}
}

// A restored position below the log start (records deleted by retention
// while the job was down): by default the source resets to the log start
// and counts what it skipped; with FailOnOutOfRange it fails the job,
// naming the partition. Never a silent skip.
func TestPositionBelowTheLogStartResetsCountingSkippedOrFails(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 1, nil)
	produce(t, env, "in", 1, 0, 100, "r", nil)
	del := kadm.Offsets{}
	del.Add(kadm.Offset{Topic: "in", Partition: 0, At: 60})
	if _, err := env.Admin(t).DeleteRecords(t.Context(), del); err != nil {
		t.Fatal(err)
	}
	restored := [][]byte{encodeOffset(PartitionOffset{Topic: "in", Partition: 0, Offset: 20})}
	t.Run("reset", func(t *testing.T) {
		s, err := openSource(t, env, restored, Topics("in"))
		if err != nil {
			t.Fatal(err)
		}
		got, err := pollUntil(t, s, 40)
		if err != nil {
			t.Fatal(err)
		}
		sameSet(t, got, names("r", 60, 40))
		if n := s.skipped.Load(); n != 40 {
			t.Fatalf("%d records counted skipped, want 40 (offsets 20-59)", n)
		}
	})
	t.Run("fail", func(t *testing.T) {
		s, err := openSource(t, env, restored, Topics("in"), OnOutOfRange(FailOnOutOfRange))
		if err != nil {
			t.Fatal(err)
		}
		_, err = pollUntil(t, s, 1)
		if !errors.Is(err, ErrOffsetOutOfRange) || !runtime.IsUnrecoverable(err) {
			t.Fatalf("Poll: %v; want an unrecoverable error wrapping ErrOffsetOutOfRange", err)
		}
	})
}

// A topic deleted while the source reads it fails the task with
// ErrTopicGone at the next discovery: its offsets in state cannot apply to
// a topic created again under the name.
func TestDeletedTopicFailsTheSource(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "doomed", 2, nil)
	produce(t, env, "doomed", 2, 0, 10, "r", nil)
	s, err := openSource(t, env, nil, Topics("doomed"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pollUntil(t, s, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Admin(t).DeleteTopic(t.Context(), "doomed"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for {
		err := s.Poll(ctx, &sliceCollector{})
		if errors.Is(err, ErrTopicGone) {
			return
		}
		if err != nil || ctx.Err() != nil {
			t.Fatalf("Poll after the topic was deleted: %v; want an error wrapping ErrTopicGone", err)
		}
	}
}

// Discovery: partitions added to a topic and a new topic matching the
// regular expression are read without a restart, from their earliest
// offset.
func TestDiscoveryFindsNewPartitionsAndMatchingTopics(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "events-a", 1, nil)
	produce(t, env, "events-a", 1, 0, 10, "a", nil)
	s, err := openSource(t, env, nil, TopicRegex(`events-.*`), Group("g"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pollUntil(t, s, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Admin(t).CreatePartitions(t.Context(), 2, "events-a"); err != nil {
		t.Fatal(err)
	}
	env.CreateTopic(t, "events-b", 2, nil)
	env.CreateTopic(t, "other", 1, nil)
	produce(t, env, "events-a", 3, 10, 30, "a", nil) // partitions 0, 1, 2
	produce(t, env, "events-b", 2, 0, 20, "b", nil)
	produce(t, env, "other", 1, 0, 5, "o", nil)
	got, err := pollUntil(t, s, 50)
	if err != nil {
		t.Fatal(err)
	}
	sameSet(t, got, append(names("a", 10, 30), names("b", 0, 20)...))
}

// On checkpoint completion the positions of that checkpoint go to the
// consumer group (for monitoring), and the metrics show each partition's
// currentOffset, committedOffset and pendingRecords.
func TestCompletedCheckpointCommitsItsOffsetsToTheGroup(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 2, nil)
	produce(t, env, "in", 2, 0, 40, "r", nil)
	s, err := openSource(t, env, nil, Topics("in"), Group("monitor"), MaxPollRecords(30))
	if err != nil {
		t.Fatal(err)
	}
	// 20 records per partition: reading 30 reads from both (a poll may
	// return up to 30, so 30 to 40 records in all).
	read, err := pollUntil(t, s, 30)
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.Snapshot(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int32]int64{}
	var total int64
	for _, e := range st.Entries {
		pos, err := DecodeOffsets(e)
		if err != nil {
			t.Fatal(err)
		}
		want[pos[0].Partition] = pos[0].Offset
		total += pos[0].Offset
	}
	if len(want) != 2 || total != int64(len(read)) {
		t.Fatalf("snapshot positions %v, want both partitions, %d records in all (as read)", want, len(read))
	}
	if err := s.NotifyCheckpointComplete(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the group's commit", func() bool {
		resp, err := env.Admin(t).FetchOffsets(t.Context(), "monitor")
		if err != nil {
			return false
		}
		for p, o := range want {
			if c, ok := resp.Lookup("in", p); !ok || c.At != o {
				return false
			}
		}
		return true
	})
	waitFor(t, 10*time.Second, "committedOffset", func() bool {
		c := s.eachPartition(func(ps *partition) (float64, bool) { return float64(ps.committed.Load()), ps.committed.Load() >= 0 })
		return len(c) == 2
	})
	cur := s.eachPartition(func(ps *partition) (float64, bool) { return float64(ps.next.Load()), true })
	pending := s.eachPartition(lag)
	for p, o := range want {
		k := tp{"in", p}.String()
		if cur[k] != float64(o) || pending[k] != float64(20-o) {
			t.Fatalf("partition %s: currentOffset %v, pendingRecords %v; want %d and %d", k, cur[k], pending[k], o, 20-o)
		}
	}
}

// A record that fails to decode goes to the dead-letter topic through the
// share-group source's code (internal/deadletter: its headers), inside
// the checkpoint's transaction: invisible to read_committed readers until
// the checkpoint completes, then there once; it is not emitted.
func TestUndecodableRecordsGoToTheDeadLetterTopicWithTheCheckpoint(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 1, nil)
	produce(t, env, "in", 1, 0, 10, "r", nil)
	f, err := New(func(r *kgo.Record) (string, error) {
		if string(r.Value) == "r4" {
			return "", errors.New("not a click")
		}
		return string(r.Value), nil
	}, Brokers(env.Addr), Topics("in"), Group("g"))
	if err != nil {
		t.Fatal(err)
	}
	s := f().(*Source[string])
	t.Cleanup(func() { _ = s.Close() })
	if err := s.Open(t.Context(), &runtime.OperatorContext{Job: "j", UID: "src", Parallelism: 1}); err != nil {
		t.Fatal(err)
	}
	got, err := pollUntil(t, s, 9)
	if err != nil {
		t.Fatal(err)
	}
	sameSet(t, got, append(names("r", 0, 4), names("r", 5, 5)...))
	st, err := s.Snapshot(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Handles) != 1 {
		t.Fatalf("snapshot names %d transactions, want the dead letter's", len(st.Handles))
	}
	if dl := env.ReadCommitted(t, "g-dlq"); len(dl) != 0 {
		t.Fatalf("%d dead letters visible before the checkpoint completed", len(dl))
	}
	if err := s.NotifyCheckpointComplete(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	dl := env.ReadCommitted(t, "g-dlq")
	if len(dl) != 1 || string(dl[0].Value) != "r4" {
		t.Fatalf("dead letters %v, want r4 once", values(t, env, "g-dlq"))
	}
	hs := map[string]string{}
	for _, h := range dl[0].Headers {
		hs[h.Key] = string(h.Value)
	}
	if !strings.Contains(hs[deadletter.HeaderError], "not a click") || hs[deadletter.HeaderTopic] != "in" || hs[deadletter.HeaderOffset] != "4" {
		t.Fatalf("dead-letter headers %v, want the reason, topic in, offset 4", hs)
	}
}
