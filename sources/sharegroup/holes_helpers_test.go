package sharegroup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// Helpers of the record-by-record tests of issue 9 (holes_test.go,
// holes_api_test.go): what was emitted, what committed markers cover, where
// the share start offset is.

// shortLock is the record lock duration of lockBroker(shortLock): short
// enough that a paused lane loses its locks quickly, long enough that a
// lane renewing every second keeps them under load.
const shortLock = 2 * time.Second

// lockBroker is a broker whose record locks last lock and are swept every
// 100 ms, with 200 ms share heartbeats.
func lockBroker(lock time.Duration) []broker.Opt {
	return []broker.Opt{
		broker.Config("group.share.record.lock.duration.ms", strconv.Itoa(int(lock.Milliseconds()))),
		broker.Config("share.record.lock.sweep.interval.ms", "100"),
		broker.Config("group.share.heartbeat.interval.ms", "200"),
	}
}

// pausedOpt stops the source's lock renewals: a process that is paused
// while it holds records.
var pausedOpt = withCfg(func(c *cfg) { c.paused = true })

// noLockClock switches the holder's own lock clock off, to exercise the
// defences behind it (refused renewals, duplicate offsets, the conflict
// check).
var noLockClock = withCfg(func(c *cfg) { c.lockMargin, c.testNoLockClock = -time.Hour, true })

// withCfg is an Opt that sets unexported configuration (tests only).
func withCfg(fn func(*cfg)) Opt { return opt{fn} }

// produceTo produces the values from..to-1 (each its produce index) to one
// partition.
func produceTo(t *testing.T, env *kafkatest.Env, topic string, partition int32, from, to int) {
	t.Helper()
	cl := env.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	var recs []*kgo.Record
	for i := from; i < to; i++ {
		recs = append(recs, &kgo.Record{Topic: topic, Partition: partition, Value: []byte(strconv.Itoa(i))})
	}
	if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// counts returns how often each produce index was emitted.
func counts(t *testing.T, vals []string) map[int]int {
	t.Helper()
	out := map[int]int{}
	for _, v := range vals {
		i, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("emitted value %q is not a produce index", v)
		}
		out[i]++
	}
	return out
}

// exactlyOnce describes how a count per index of 0..n-1 differs from "each
// exactly once": "" when it does not.
func exactlyOnce(c map[int]int, n int) string {
	var missing, dup, extra []int
	for i := 0; i < n; i++ {
		switch {
		case c[i] == 0:
			missing = append(missing, i)
		case c[i] > 1:
			dup = append(dup, i)
		}
	}
	for i := range c {
		if i < 0 || i >= n {
			extra = append(extra, i)
		}
	}
	if len(missing)+len(dup)+len(extra) == 0 {
		return ""
	}
	slices.Sort(extra)
	return fmt.Sprintf("missing %v, more than once %v, unexpected %v", missing, dup, extra)
}

// ackLogEntries returns every marker of the group's ack-log with its
// transaction's status, in log order, read by a fresh Index caught up to the
// log's end.
func ackLogEntries(t *testing.T, env *kafkatest.Env, group string) []acklog.Entry {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ix, err := acklog.NewIndex(ctx, []string{env.Addr}, acklog.TopicFor(group))
	if err != nil {
		t.Fatal(err)
	}
	defer ix.Close()
	if err := ix.CatchUpToEnd(ctx); err != nil {
		t.Fatal(err)
	}
	var out []acklog.Entry
	for off := int64(0); off < ix.Position(); off++ {
		if e, ok := ix.Status(off); ok {
			out = append(out, e)
		}
	}
	return out
}

// committedCover counts, per offset of tp, the committed markers covering it.
func committedCover(entries []acklog.Entry, tp acklog.TopicPartition) map[int]int {
	out := map[int]int{}
	for _, e := range entries {
		if e.Status != acklog.Committed {
			continue
		}
		for _, r := range e.Marker.Ranges[tp] {
			for o := r.Start; o < r.End; o++ {
				out[int(o)]++
			}
		}
	}
	return out
}

// describeMarkers lists markers for failure messages.
func describeMarkers(entries []acklog.Entry) string {
	s := ""
	for _, e := range entries {
		s += fmt.Sprintf("\n  ack-log@%d %s member=%s checkpoint=%d txn=%s pid=%d ranges=%v",
			e.Offset, e.Status, e.Marker.Member, e.Marker.Checkpoint, e.Marker.TransactionalID, e.Marker.ProducerID, e.Marker.Ranges)
	}
	return s
}

// shareStart returns the group's share start offset of tp (-1 if the group
// has none for it).
func shareStart(t *testing.T, env *kafkatest.Env, group string, tp acklog.TopicPartition) int64 {
	t.Helper()
	cl := env.Client(t)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	starts, err := StartOffsets(ctx, cl, group)
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := starts[tp]; ok {
		return s
	}
	return -1
}

// setShareStart resets the share start offset of topic[partition] of an
// empty share group (AlterShareGroupOffsets), waiting until the members of
// a closed source have left.
func setShareStart(t *testing.T, env *kafkatest.Env, group, topic string, partition int32, offset int64) {
	t.Helper()
	cl := env.Client(t)
	defer cl.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		req := kmsg.NewPtrAlterShareGroupOffsetsRequest()
		req.GroupID = group
		rt := kmsg.NewAlterShareGroupOffsetsRequestTopic()
		rt.Topic = topic
		rp := kmsg.NewAlterShareGroupOffsetsRequestTopicPartition()
		rp.Partition, rp.StartOffset = partition, offset
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(t.Context(), cl)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		if err == nil {
			for _, rt := range resp.Topics {
				for _, rp := range rt.Partitions {
					if e := kerr.ErrorForCode(rp.ErrorCode); e != nil && err == nil {
						err = e
					}
				}
			}
		}
		if err == nil {
			return
		}
		if !errors.Is(err, kerr.NonEmptyGroup) || time.Now().After(deadline) {
			t.Fatalf("reset share start of %s %s[%d] to %d: %v", group, topic, partition, offset, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runCheckpoints drives s as a task with checkpoints does: poll a while,
// Snapshot(id), NotifyCheckpointComplete(id), id+1, ..., until the share
// start offset of tp reaches n or within passes. It returns the emitted
// values and the next checkpoint id. An error fails the test.
func runCheckpoints(t *testing.T, env *kafkatest.Env, s *Source[string], group string, tp acklog.TopicPartition, n int64,
	id checkpoint.ID, within time.Duration) ([]string, checkpoint.ID) {
	t.Helper()
	c := &sliceCollector{}
	ctx := t.Context()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
			if err := s.Poll(ctx, c); err != nil {
				t.Fatalf("Poll: %v", err)
			}
		}
		if _, err := s.Snapshot(ctx, id); err != nil {
			t.Fatalf("Snapshot(%d): %v", id, err)
		}
		notifyComplete(t, s, id)
		id++
		if shareStart(t, env, group, tp) >= n {
			break
		}
	}
	return c.vals, id
}

// checkEveryRecordOnce checks that 0..n-1 were emitted once (by who), are covered by
// exactly one committed marker, none was dead-lettered, and the share start
// offset is n.
func checkEveryRecordOnce(t *testing.T, env *kafkatest.Env, vals []string, n int, who string) {
	t.Helper()
	entries := ackLogEntries(t, env, "g")
	if d := exactlyOnce(counts(t, vals), n); d != "" {
		t.Errorf("%s emitted: %s", who, d)
	}
	if d := exactlyOnce(committedCover(entries, in0), n); d != "" {
		t.Errorf("committed markers: %s (share start offset %d: records below it and in no committed marker were archived or skipped)%s",
			d, shareStart(t, env, "g", in0), describeMarkers(entries))
	}
	if dlq := env.ReadCommitted(t, "g-dlq"); len(dlq) != 0 {
		t.Errorf("%d records dead-lettered, want none", len(dlq))
	}
	if st := shareStart(t, env, "g", in0); st != int64(n) {
		t.Errorf("share start offset %d, want %d", st, n)
	}
}

// zombieAndRedelivery starts a broker with short locks and 20 records in
// "in"; subtask 0 (a, paused, its own lock clock off) acquires and emits
// all 20 and loses its locks; then subtask bSubtask (b, own lock clock off)
// gets the same 20 at delivery 2 and emits them.
func zombieAndRedelivery(t *testing.T, bSubtask int) (env *kafkatest.Env, a, b *Source[string]) {
	t.Helper()
	env = kafkatest.New(t, lockBroker(shortLock)...)
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", 20)
	a = openSource(t, env, 0, nil, noLockClock, pausedOpt)
	if d := exactlyOnce(counts(t, pollFor(t, a, 20, 10*time.Second)), 20); d != "" {
		t.Fatalf("setup: the zombie's batch: %s", d)
	}
	time.Sleep(shortLock + time.Second) // its locks lapse
	b = openSource(t, env, bSubtask, nil, noLockClock)
	if d := exactlyOnce(counts(t, pollFor(t, b, 20, 10*time.Second)), 20); d != "" {
		t.Fatalf("setup: the redelivery to subtask %d: %s", bSubtask, d)
	}
	return env, a, b
}

// openOnBroker opens a source against a kfake cluster that speaks at most
// the given API versions and has topic "in", and returns Open's error.
func openOnBroker(t *testing.T, v *kversion.Versions) error {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "in"), kfake.MaxVersions(v))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	newSrc, err := New(func(r *kgo.Record) (string, error) { return "", nil }, Brokers(c.ListenAddrs()...), Topics("in"), Group("g"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	s := newSrc()
	defer s.Close()
	return s.Open(ctx, &runtime.OperatorContext{Job: "j", UID: "s", Parallelism: 1, Logger: zap.NewNop()})
}

// notifyComplete notifies s that checkpoint id completed and waits until
// its lanes finished the epochs id covers (each lane ACCEPTs on its own
// goroutine), so that the broker's share state shows their ACCEPTs.
func notifyComplete(t *testing.T, s *Source[string], id checkpoint.ID) {
	t.Helper()
	if err := s.NotifyCheckpointComplete(t.Context(), id); err != nil {
		t.Fatalf("NotifyCheckpointComplete(%d): %v", id, err)
	}
	due := completedBy(id)
	for _, l := range s.lanes {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
			l.mu.Lock()
			pending := due(l)
			l.mu.Unlock()
			if !pending {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s did not finish the epoch of completed checkpoint %d", l.name, id)
			}
		}
		// A finish in progress holds the lane's acknowledgement lock.
		l.ack.mu.Lock()
		//lint:ignore SA2001 taking the lock waits for the finish
		l.ack.mu.Unlock()
	}
}
