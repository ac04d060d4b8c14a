// Tests of issue 9 that drive the source through setPaused (a process that
// pauses and resumes), OpenMarkerWait and NotifyJobCanceled.

package sharegroup

import (
	"errors"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// Issue 9, case 2: a lane whose locks lapsed (paused) renews again: the
// broker refuses the renewal (another subtask holds the records now), and
// FlushAcks says nothing. The refusal must be seen: the lane's checkpoint
// declines and the lane never ACCEPTs those records. Its own lock clock is
// off (noLockClock), so only the refusal can tell (measured: the
// broker answers the renewal INVALID_RECORD_STATE, seen only by a
// kgo.ShareAckCallback).
func TestRefusedRenewalDeclinesAndTheLaneNeverAccepts(t *testing.T) {
	env := kafkatest.New(t, lockBroker(shortLock)...)
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", 10)
	ctx := t.Context()
	a := openSource(t, env, 0, nil, noLockClock)
	a.setPaused(true)
	if d := exactlyOnce(counts(t, pollFor(t, a, 10, 10*time.Second)), 10); d != "" {
		t.Fatalf("setup: A's batch: %s", d)
	}
	time.Sleep(shortLock + time.Second) // A's locks lapse
	b := openSource(t, env, 1, nil)
	bVals := pollFor(t, b, 10, 10*time.Second)
	if d := exactlyOnce(counts(t, bVals), 10); d != "" {
		t.Fatalf("setup: the redelivery to B: %s", d)
	}
	a.setPaused(false)
	time.Sleep(shortLock + time.Second) // A renews; the broker refuses: B holds the records
	if st := shareStart(t, env, "g", in0); st != 0 {
		t.Fatalf("share start %d before any checkpoint, want 0", st)
	}
	if _, err := a.Snapshot(ctx, 1); !errors.Is(err, checkpoint.ErrDeclined) {
		if err == nil {
			err = a.NotifyCheckpointComplete(ctx, 1)
		}
		t.Fatalf("A's renewal of records B holds was refused by the broker, but A's checkpoint was not declined "+
			"(Snapshot(1), then NotifyCheckpointComplete: %v); share start now %d%s",
			err, shareStart(t, env, "g", in0), describeMarkers(ackLogEntries(t, env, "g")))
	}
	if err := a.NotifyCheckpointAborted(ctx, 1); !errors.Is(err, ErrRolledBack) {
		t.Fatalf("A on abort: got %v, want ErrRolledBack", err)
	}
	if st := shareStart(t, env, "g", in0); st != 0 {
		t.Fatalf("share start %d after A's declined checkpoint, want 0 (nothing ACCEPTed by A)", st)
	}
	vals, _ := runCheckpoints(t, env, b, "g", in0, 10, 2, 15*time.Second)
	checkEveryRecordOnce(t, env, append(bVals, vals...), 10, "B")
}

// A lane whose batch waits behind a blocked task (acquired, not admitted)
// and whose renewal the broker refuses (its locks lapsed while the process
// was paused, and another subtask holds the records now) has emitted
// nothing of them: at admission it releases them instead of emitting them,
// and its checkpoint goes through. Emitting them would force the decline
// above and roll the whole job back for records this lane never
// processed, which under load (renewals starved) turned into restart after
// restart. Its own lock clock is off, so only the refusal can tell.
func TestARefusedBatchNotYetAdmittedIsReleasedNotEmitted(t *testing.T) {
	env := kafkatest.New(t, lockBroker(shortLock)...)
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", 10)
	ctx := t.Context()
	a := openSource(t, env, 0, nil, noLockClock, pausedOpt)
	if !waitLaneReady(t, a, 10*time.Second) {
		t.Fatal("setup: A's lane acquired nothing")
	}
	time.Sleep(shortLock + time.Second) // A's locks lapse: it is paused
	b := openSource(t, env, 1, nil)
	bVals := pollFor(t, b, 10, 10*time.Second)
	if d := exactlyOnce(counts(t, bVals), 10); d != "" {
		t.Fatalf("setup: the redelivery to B: %s", d)
	}
	a.setPaused(false) // A renews; the broker refuses: B holds the records
	l := a.lanes[0]
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		l.mu.Lock()
		lost := len(l.clock.lost)
		l.mu.Unlock()
		if lost > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("setup: A's renewal was not refused within 10 s")
		}
	}
	c := &sliceCollector{}
	if err := a.Poll(ctx, c); err != nil {
		t.Fatalf("A's Poll: %v", err)
	}
	if len(c.vals) != 0 {
		t.Errorf("A emitted %d records of a partition whose renewal the broker had refused before they were admitted, "+
			"want none", len(c.vals))
	}
	if _, err := a.Snapshot(ctx, 1); err != nil {
		t.Fatalf("A's checkpoint 1: %v, want it to go through (A emitted nothing it lost)", err)
	}
	notifyComplete(t, a, 1)
	vals, _ := runCheckpoints(t, env, b, "g", in0, 10, 1, 15*time.Second)
	checkEveryRecordOnce(t, env, append(bVals, vals...), 10, "B")
}

// Issue 9, case 3a: a job that pre-committed a marker and is cancelled for
// good aborts its open and pre-committed transactions and releases what it
// holds: the next job (another transactional-id prefix) gets every record
// at once and commits each exactly once. Locks are Kafka's 30 s: only a
// release brings the records back within the test.
func TestCancelledJobAbortsItsMarkersSoTheNextJobCommitsEveryRecord(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", 10)
	ctx := t.Context()
	job1 := openSource(t, env, 0, nil, TransactionalIDPrefix("job1"))
	if d := exactlyOnce(counts(t, pollFor(t, job1, 10, 10*time.Second)), 10); d != "" {
		t.Fatalf("setup: job 1's batch: %s", d)
	}
	if _, err := job1.Snapshot(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := job1.NotifyJobCanceled(ctx, 0); err != nil {
		t.Fatalf("NotifyJobCanceled: %v", err)
	}
	for _, e := range ackLogEntries(t, env, "g") {
		if e.Status != acklog.Aborted {
			t.Fatalf("after NotifyJobCanceled, job 1's marker at %d is %s, want aborted", e.Offset, e.Status)
		}
	}
	job2 := openSource(t, env, 0, nil, TransactionalIDPrefix("job2"))
	vals, _ := runCheckpoints(t, env, job2, "g", in0, 10, 1, 15*time.Second)
	checkEveryRecordOnce(t, env, vals, 10, "job 2")
}

// Issue 9, case 3b: job 1 crashes (SIGKILL) after pre-committing its
// marker; job 2 (another prefix) finds the records behind that foreign open
// marker. It waits OpenMarkerWait, then aborts the stale transaction by its
// recorded handle and processes the records, instead of RELEASEing them at
// every checkpoint until the broker archives them (Kafka's delivery limit 5).
func TestForeignOpenMarkerOfACrashedJobIsAbortedAfterTheWait(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	env := kafkatest.New(t, broker.Config("group.share.record.lock.duration.ms", "2000"),
		broker.Config("share.record.lock.sweep.interval.ms", "100"),
		broker.Config("group.share.delivery.count.limit", "5"))
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", 50)
	killChildHoldingRecords(t, env)
	job2 := openSource(t, env, 0, nil, TransactionalIDPrefix("job2"), OpenMarkerWait(2*time.Second))
	// Released after the abort, the records come back at their third
	// delivery and are re-queued: wait for the copies too.
	vals := drainOneLane(t, env, job2, 50)
	checkEveryRecordOnce(t, env, vals, 50, "job 2")
}
