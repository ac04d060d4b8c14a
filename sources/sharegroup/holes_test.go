package sharegroup

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// Record-by-record tests of issue 9: the exactly-once holes of the
// share-group source. Each checks which offsets were emitted, which are
// covered by committed ack markers, and where the share start offset ends.

var in0 = acklog.TopicPartition{Topic: "in", Partition: 0}

// Issue 9, case 1: lane A of subtask 0 loses its locks unnoticed (paused; its
// own lock clock switched off, as after a broker restart), the broker
// redelivers the offsets to lane B of the same subtask, which emits them
// again. The offsets are in the subtask's open epoch twice: the checkpoint
// must be declined as a lost lock, and after the rollback every record is
// processed and committed exactly once.
func TestOffsetAcquiredTwiceByLanesOfOneSubtaskDeclinesTheCheckpoint(t *testing.T) {
	env := kafkatest.New(t, lockBroker(shortLock)...)
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", 20)
	s := openSource(t, env, 0, nil, Lanes(2), noLockClock, pausedOpt)
	first := pollFor(t, s, 20, 10*time.Second)
	if d := exactlyOnce(counts(t, first), 20); d != "" {
		t.Fatalf("setup: the first lane's batch: %s", d)
	}
	// Lane A's locks lapse; the other lane of the same subtask gets the
	// same offsets at delivery 2 and emits them again.
	again := pollFor(t, s, 20, 15*time.Second)
	if d := exactlyOnce(counts(t, again), 20); d != "" {
		t.Fatalf("setup: the redelivery to the second lane: %s", d)
	}
	_, err := s.Snapshot(t.Context(), 1)
	if !errors.Is(err, checkpoint.ErrDeclined) {
		t.Fatalf("offsets 0-19 were acquired and emitted twice in subtask 0's open epoch (both lanes), "+
			"but Snapshot(1) returned %v; want an error wrapping checkpoint.ErrDeclined (a lost lock)%s",
			err, describeMarkers(ackLogEntries(t, env, "g")))
	}
	if err := s.NotifyCheckpointAborted(t.Context(), 1); !errors.Is(err, ErrRolledBack) {
		t.Fatalf("abort of the declined checkpoint: got %v, want ErrRolledBack", err)
	}
	s.Close()
	if cov := committedCover(ackLogEntries(t, env, "g"), in0); len(cov) != 0 {
		t.Fatalf("after the decline committed markers cover %v, want none", cov)
	}
	// The restarted subtask processes each record once.
	b := openSource(t, env, 0, nil, Lanes(2))
	vals, _ := runCheckpoints(t, env, b, "g", in0, 20, 2, 15*time.Second)
	checkEveryRecordOnce(t, env, vals, 20, "the restarted subtask")
}

// Issue 9, case 1, second part: two markers of the same subtask in
// successive checkpoints share a producer id (a transactional id keeps its
// producer id; a zombie attempt and the next attempt of subtask 0 use the
// same pool of ids). The conflict check must compare them by marker
// identity, not skip the earlier one for its equal producer id: whatever
// the order of the markers, no offset may end up in two committed markers.
func TestMarkersOfOneSubtaskWithEqualProducerIDStillConflict(t *testing.T) {
	for _, zombieFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("zombie marker first=%v", zombieFirst), func(t *testing.T) {
			// The zombie attempt of subtask 0 and the next attempt of
			// subtask 0: same transactional ids.
			env, a, b := zombieAndRedelivery(t, 0)
			ctx := t.Context()
			first, second := b, a
			if zombieFirst {
				first, second = a, b
			}
			var errs [2]error
			if _, errs[0] = first.Snapshot(ctx, 1); errs[0] == nil {
				errs[0] = first.NotifyCheckpointComplete(ctx, 1)
			}
			if _, errs[1] = second.Snapshot(ctx, 2); errs[1] == nil {
				errs[1] = second.NotifyCheckpointComplete(ctx, 2)
			}
			entries := ackLogEntries(t, env, "g")
			pids := map[int64]bool{}
			for _, e := range entries {
				pids[e.Marker.ProducerID] = true
			}
			if len(entries) == 2 && len(pids) != 1 {
				t.Fatalf("setup: the two markers have producer ids %v; the test needs them equal%s", pids, describeMarkers(entries))
			}
			cov := committedCover(entries, in0)
			var twice []int
			for o, n := range cov {
				if n > 1 {
					twice = append(twice, o)
				}
			}
			if len(twice) > 0 {
				slices.Sort(twice)
				t.Fatalf("offsets %v are in %d committed markers of one subtask (same producer id): processed twice. "+
					"checkpoint 1: %v; checkpoint 2: %v%s", twice, cov[twice[0]], errs[0], errs[1], describeMarkers(entries))
			}
			if len(cov) != 20 {
				t.Fatalf("committed markers cover %d offsets, want all 20 exactly once (one checkpoint commits); "+
					"checkpoint 1: %v; checkpoint 2: %v%s", len(cov), errs[0], errs[1], describeMarkers(entries))
			}
		})
	}
}

// Issue 9, case 5a: the share-group state is reset to the earliest offset
// (an admin reset, or a broker that lost it): committed records come back at
// delivery count 1. They must be recognised by the ack-log, ACCEPTed and not
// emitted again.
func TestCommittedRecordsBackAtDeliveryOneAfterAShareStateResetAreNotEmitted(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", 10)
	a := openSource(t, env, 0, nil)
	vals, _ := runCheckpoints(t, env, a, "g", in0, 10, 1, 15*time.Second)
	if d := exactlyOnce(counts(t, vals), 10); d != "" {
		t.Fatalf("setup: first run emitted: %s", d)
	}
	if st := shareStart(t, env, "g", in0); st != 10 {
		t.Fatalf("setup: share start %d after the first run, want 10", st)
	}
	a.Close()
	setShareStart(t, env, "g", "in", 0, 0)
	if st := shareStart(t, env, "g", in0); st != 0 {
		t.Fatalf("setup: share start %d after the reset, want 0", st)
	}
	b := openSource(t, env, 0, nil)
	again, _ := runCheckpoints(t, env, b, "g", in0, 10, 100, 10*time.Second)
	entries := ackLogEntries(t, env, "g")
	if len(again) != 0 {
		t.Errorf("after the share-state reset, offsets already committed were emitted again: %v (each in a committed marker: %v)",
			again, committedCover(entries, in0))
	}
	if d := exactlyOnce(committedCover(entries, in0), 10); d != "" {
		t.Errorf("committed markers: %s%s", d, describeMarkers(entries))
	}
	if st := shareStart(t, env, "g", in0); st != 10 {
		t.Errorf("share start offset %d, want 10 (the redelivered records ACCEPTed as already processed)", st)
	}
}

// Issue 9, case 5c: the share start offset jumps past offsets that no
// committed marker covers (an admin reset to the log end, a broker that
// came back with its start at the log end): those records were never
// processed. The source must fail with an error naming the group and the
// partition, never skip them silently.
func TestShareStartJumpingPastUncommittedOffsetsFailsNamingGroupAndPartition(t *testing.T) {
	const group = "jumpgroup"
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", 10)
	a := openSource(t, env, 0, nil, Group(group), BatchSize(5))
	vals, _ := runCheckpoints(t, env, a, group, in0, 5, 1, 15*time.Second)
	if d := exactlyOnce(counts(t, vals), 5); d != "" {
		t.Fatalf("setup: first run emitted: %s", d)
	}
	a.Close()
	if st := shareStart(t, env, group, in0); st != 5 {
		t.Fatalf("setup: share start %d after the first run, want 5", st)
	}
	setShareStart(t, env, group, "in", 0, 10) // offsets 5-9: never processed
	// The source may refuse at Open already, or while it runs.
	b, err := openSourceErr(t, env, 0, nil, Group(group), BatchSize(5))
	c := &sliceCollector{}
	ctx := t.Context()
	cycles := 0
	for deadline := time.Now().Add(8 * time.Second); err == nil && time.Now().Before(deadline); cycles++ {
		for end := time.Now().Add(200 * time.Millisecond); err == nil && time.Now().Before(end); {
			err = b.Poll(ctx, c)
		}
		if err == nil {
			_, err = b.Snapshot(ctx, checkpoint.ID(10+cycles))
		}
		if err == nil {
			err = b.NotifyCheckpointComplete(ctx, checkpoint.ID(10+cycles))
		}
	}
	cov := committedCover(ackLogEntries(t, env, group), in0)
	if err == nil {
		t.Fatalf("the share start offset jumped from 5 to %d past offsets 5-9, which no committed marker covers "+
			"(committed: %v; emitted after the jump: %v), and the source ran %d checkpoints without an error: silent loss",
			shareStart(t, env, group, in0), cov, c.vals, cycles)
	}
	msg := err.Error()
	if !strings.Contains(msg, group) || !(strings.Contains(msg, in0.String()) || strings.Contains(msg, "partition")) {
		t.Fatalf("error %q does not name the group %q and the partition %s", msg, group, in0)
	}
	t.Logf("the source failed with: %v", err)
}

// Issue 9, case 6: a checkpoint declined by the conflict check aborts its own
// marker's transaction at once, without waiting for
// NotifyCheckpointAborted (which may be lost), so redeliveries are not set
// aside behind it and it cannot be pre-committed later as n+1.
func TestDeclinedMarkerIsAbortedAtOnce(t *testing.T) {
	env, a, b := zombieAndRedelivery(t, 1)
	if _, err := b.Snapshot(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	if err := b.NotifyCheckpointComplete(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Snapshot(t.Context(), 2); !errors.Is(err, checkpoint.ErrDeclined) {
		t.Fatalf("setup: zombie A's checkpoint: got %v, want a decline", err)
	}
	// No NotifyCheckpointAborted: the notification is lost.
	entries := ackLogEntries(t, env, "g")
	found := false
	for _, e := range entries {
		if e.Marker.Member != "src#0" || e.Marker.Checkpoint != 2 {
			continue
		}
		found = true
		if e.Status != acklog.Aborted {
			t.Fatalf("the declined marker of checkpoint 2 at ack-log offset %d is %s, want aborted at the decline%s",
				e.Offset, e.Status, describeMarkers(entries))
		}
	}
	if d := exactlyOnce(committedCover(entries, in0), 20); d != "" {
		t.Fatalf("committed markers: %s%s", d, describeMarkers(entries))
	}
	t.Logf("declined marker written: %v (aborted if written)", found)
}

// gateCollector blocks in Collect on the first value for which block
// returns true, until release is closed: a downstream that applies
// back-pressure.
type gateCollector struct {
	mu      sync.Mutex
	vals    []string
	block   func(v string) bool
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (c *gateCollector) Collect(v string) {
	if c.block != nil && c.block(v) {
		c.once.Do(func() {
			close(c.entered)
			<-c.release
		})
	}
	c.mu.Lock()
	c.vals = append(c.vals, v)
	c.mu.Unlock()
}

func (c *gateCollector) values() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.vals...)
}

// Issue 9, case 7: one lane's emit blocked by back-pressure for three lock
// durations must not stop the renewals of another lane's held batch: its
// checkpoint does not decline, and every record is committed once and
// ACCEPTed.
func TestBlockedEmitDoesNotStopRenewalsOfOtherLanes(t *testing.T) {
	const lock = 3 * time.Second
	env := kafkatest.New(t, lockBroker(lock)...)
	env.CreateTopic(t, "in", 2, nil)
	in1 := acklog.TopicPartition{Topic: "in", Partition: 1}
	s := openSource(t, env, 0, nil, Lanes(2))
	produceTo(t, env, "in", 0, 0, 10)
	c := &gateCollector{entered: make(chan struct{}), release: make(chan struct{})}
	ctx := t.Context()
	for deadline := time.Now().Add(10 * time.Second); len(c.values()) < 10 && time.Now().Before(deadline); {
		if err := s.Poll(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if d := exactlyOnce(counts(t, c.values()), 10); d != "" {
		t.Fatalf("setup: partition 0's batch: %s", d)
	}
	// The other lane's batch: emitting its first record blocks.
	c.block = func(v string) bool { return v >= "10" && len(v) == 2 }
	produceTo(t, env, "in", 1, 10, 20)
	done := make(chan error, 1)
	go func() {
		var err error
		for deadline := time.Now().Add(30 * time.Second); err == nil && len(c.values()) < 20 && time.Now().Before(deadline); {
			err = s.Poll(ctx, c)
		}
		done <- err
	}()
	select {
	case <-c.entered:
	case <-time.After(15 * time.Second):
		close(c.release)
		<-done
		t.Fatal("setup: partition 1's records never reached the collector")
	}
	time.Sleep(3 * lock) // downstream is stuck
	close(c.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if d := exactlyOnce(counts(t, c.values()), 20); d != "" {
		t.Fatalf("emitted: %s", d)
	}
	if _, err := s.Snapshot(ctx, 1); err != nil {
		t.Fatalf("while one lane's emit was blocked for %v, the other lane's held batch was not renewed: Snapshot(1): %v", 3*lock, err)
	}
	notifyComplete(t, s, 1)
	entries := ackLogEntries(t, env, "g")
	c0, c1 := committedCover(entries, in0), committedCover(entries, in1)
	for o, n := range c1 {
		c0[o+10] += n // partition 1 holds values 10-19 at offsets 0-9
	}
	if d := exactlyOnce(c0, 20); d != "" {
		t.Errorf("committed markers: %s%s", d, describeMarkers(entries))
	}
	if s0, s1 := shareStart(t, env, "g", in0), shareStart(t, env, "g", in1); s0 != 10 || s1 != 10 {
		t.Errorf("share start offsets %d and %d, want 10 and 10 (every record ACCEPTed)", s0, s1)
	}
}

// Issue 9, case 8: a Kafka 4.1 broker has share groups but not KIP-1222's
// renew (Kafka 4.2): renewals would fail silently. Open must refuse it, as
// unrecoverable, naming the minimum version.
func TestBrokerWithoutRenewIsRefusedNamingKafka42(t *testing.T) {
	err := openOnBroker(t, kversion.V4_1_0())
	if !errors.Is(err, ErrNoShareGroups) || !errors.Is(err, runtime.ErrUnrecoverable) || !strings.Contains(fmt.Sprint(err), "4.2") {
		t.Fatalf("Open against a Kafka 4.1 broker (no KIP-1222 renew): got %v, want an unrecoverable error wrapping "+
			"ErrNoShareGroups that names Kafka 4.2", err)
	}
}

// Issue 9, case 4: with Kafka's default delivery limit (5), a job that
// holds records and is restarted 6 times in a row (each attempt polls every
// record and closes without completing a checkpoint) loses nothing and
// dead-letters nothing: at their last healthy delivery the records are
// re-queued (copied to the retry topic with their originals acknowledged,
// in one committed transaction), and the 7th attempt emits and commits
// every record once.
func TestSixRestartsUnderKafkasDeliveryLimitLoseAndDeadLetterNothing(t *testing.T) {
	// 3 s locks: a source that does not release on Close gets its records
	// back within the test too.
	env := kafkatest.New(t, broker.Config("group.share.delivery.count.limit", "5"),
		broker.Config("group.share.record.lock.duration.ms", "3000"), broker.Config("share.record.lock.sweep.interval.ms", "100"))
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", 10)
	var perAttempt []int
	for i := 1; i <= 6; i++ {
		s := openSource(t, env, 0, nil)
		perAttempt = append(perAttempt, len(pollFor(t, s, 10, 5*time.Second)))
		s.Close() // the task fails before its checkpoint completes
	}
	vals := drainOneLane(t, env, openSource(t, env, 0, nil), 10)
	t.Logf("records emitted by attempts 1-6: %v", perAttempt)
	// Every value once, none dead-lettered, every original acknowledged
	// through a committed marker (the re-queue's) and the share start at 10.
	checkEveryRecordOnce(t, env, vals, 10, "the 7th attempt")
	retried := env.ReadCommitted(t, "g-retry")
	for _, r := range retried {
		if requeues(r) < 1 {
			t.Errorf("retry topic record %q without a re-queue count", r.Value)
		}
	}
	t.Logf("%d re-queued copies", len(retried))
}
