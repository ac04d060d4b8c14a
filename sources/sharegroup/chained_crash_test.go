package sharegroup

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/broker/brokerproc"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// The chaos suite's chained job (a wordcount reading, as a share group, the
// topic an upstream exactly-once job writes transactionally) lost whole input
// lines once after a task manager SIGKILL and a broker SIGKILL 1.2 s later.
// These tests put the share group that reads a transactional upstream
// through a real broker crash (brokerproc: SIGKILL, restart on the same data
// dir, the broker's repair) at the steps where the upstream's transactions
// can be lost, and require that the group is handed exactly what a
// read_committed reader of the topic sees.

// chainedCrash is the upstream side of a chained job around a broker crash.
type chainedCrash struct {
	t    *testing.T
	dir  string
	addr string
	proc *brokerproc.Proc
}

func startChainedBroker(t *testing.T) *chainedCrash {
	t.Helper()
	c := &chainedCrash{t: t, dir: t.TempDir()}
	c.proc = brokerproc.Start(t, c.dir, "127.0.0.1:0", "group.share.session.timeout.ms=3000",
		"group.share.heartbeat.interval.ms=200")
	c.addr = c.proc.Addr
	return c
}

// crash SIGKILLs the broker and starts a new one on the same dir and address.
func (c *chainedCrash) crash() {
	c.t.Helper()
	c.proc.Kill(c.t)
	c.proc = brokerproc.Start(c.t, c.dir, c.addr, "group.share.session.timeout.ms=3000",
		"group.share.heartbeat.interval.ms=200")
}

// input creates the topic "in" (one partition) and produces the values
// 0..n-1 to it; it returns the environment the source tests use.
func (c *chainedCrash) input(t *testing.T, n int) *kafkatest.Env {
	t.Helper()
	if _, err := kadm.NewClient(c.client()).CreateTopic(t.Context(), 1, 1, nil, "in"); err != nil {
		t.Fatal(err)
	}
	env := &kafkatest.Env{Addr: c.addr}
	produceN(t, env, "in", n)
	return env
}

func (c *chainedCrash) client(opts ...kgo.Opt) *kgo.Client {
	c.t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.addr)}, opts...)...)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(cl.Close)
	return cl
}

// upstream is one transactional id of the upstream job's sink.
func (c *chainedCrash) upstream(txnID string) *kgo.Client {
	return c.client(kgo.DefaultProduceTopic("up"), kgo.TransactionalID(txnID), kgo.TransactionTimeout(time.Minute),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
}

// inTxn produces values to partition 0 of "up" in a transaction of cl and
// ends it (commit) unless open.
func inTxn(ctx context.Context, t *testing.T, cl *kgo.Client, open bool, values ...string) {
	t.Helper()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, v := range values {
		r := kgo.StringRecord(v)
		r.Partition = 0
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if !open {
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
	}
}

func seq(prefix string, from, to int) []string {
	var vs []string
	for i := from; i < to; i++ {
		vs = append(vs, fmt.Sprintf("%s%d", prefix, i))
	}
	return vs
}

// drain reads the share group g on "up" until it has every value of want
// once (ACCEPTing each record), or fails naming what it got.
func (c *chainedCrash) drain(ctx context.Context, want []string, before map[string]bool) {
	c.t.Helper()
	cons := c.client(kgo.ShareGroup("g"), kgo.ConsumeTopics("up"), kgo.ShareMaxRecords(1000), kgo.ShareMaxRecordsStrict())
	got := map[string]int{}
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	missing := func() []string {
		var m []string
		for _, v := range want {
			if got[v] == 0 {
				m = append(m, v)
			}
		}
		return m
	}
	for len(missing()) > 0 && pctx.Err() == nil {
		fs := cons.PollRecords(pctx, 1000)
		for _, r := range fs.Records() {
			v := string(r.Value)
			r.Ack(kgo.AckAccept)
			if before[v] && r.DeliveryCount() > 1 {
				continue // acknowledged before the crash, redelivered for the ack-log lookup
			}
			got[v]++
		}
		if err := cons.FlushAcks(ctx); err != nil {
			c.t.Fatal(err)
		}
	}
	committed, err := kafkatest.ReadCommitted(ctx, []string{c.addr}, "up")
	if err != nil {
		c.t.Fatal(err)
	}
	var rc []string
	for _, r := range committed {
		rc = append(rc, string(r.Value))
	}
	if m := missing(); len(m) > 0 {
		c.t.Fatalf("the share group never got %s after the crash, which read_committed shows (read_committed: %s; group got: %s)",
			strings.Join(m, ","), strings.Join(rc, ","), strings.Join(slices.Sorted(maps.Keys(got)), ","))
	}
	for v, n := range got {
		if n > 1 || !slices.Contains(rc, v) {
			c.t.Errorf("the share group got %q %d times; read_committed: %s", v, n, strings.Join(rc, ","))
		}
	}
}

// TestAReadCommittedShareGroupGetsTheRecommitOfAnUpstreamTransactionTheCrashLost:
// the upstream's transaction is open (its records written) when the broker
// is SIGKILLed; the restarted broker aborts it, and the upstream, whose
// checkpoint had completed, re-commits its records in a new transaction of
// the same transactional id (internal/kafkatxn's broker-lost-transaction
// recovery), then goes on with more transactions of that id. The group,
// which had acknowledged what came before, must get the copies and what
// follows, as read_committed shows them.
func TestAReadCommittedShareGroupGetsTheRecommitOfAnUpstreamTransactionTheCrashLost(t *testing.T) {
	ctx := t.Context()
	c := startChainedBroker(t)
	if _, err := kadm.NewClient(c.client()).CreateTopic(ctx, 1, 1, nil, "up"); err != nil {
		t.Fatal(err)
	}
	if err := prepareGroup(ctx, c.client(), "g", true); err != nil {
		t.Fatal(err)
	}
	up := c.upstream("up-0")
	inTxn(ctx, t, up, false, seq("a", 0, 5)...)
	// The group acknowledges the first transaction before the crash.
	before := map[string]bool{}
	cons := c.client(kgo.ShareGroup("g"), kgo.ConsumeTopics("up"), kgo.ShareMaxRecords(1000), kgo.ShareMaxRecordsStrict())
	for len(before) < 5 {
		fs := cons.PollRecords(ctx, 1000)
		if err := fs.Err0(); err != nil {
			t.Fatal(err)
		}
		for _, r := range fs.Records() {
			r.Ack(kgo.AckAccept)
			before[string(r.Value)] = true
		}
		if err := cons.FlushAcks(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cons.Close()
	lost := seq("b", 0, 5)
	inTxn(ctx, t, up, true, lost...) // open at the crash
	c.crash()

	// The upstream's recovery: the same transactional id, a new client.
	up = c.upstream("up-0")
	inTxn(ctx, t, up, false, lost...) // the copies
	after := seq("c", 0, 5)
	inTxn(ctx, t, up, false, after...)
	c.drain(ctx, append(slices.Clone(lost), after...), before)
}

// TestAMarkerTransactionTheBrokerCrashLostIsRecommittedOrRolledBackNeverSkipped:
// a subtask holds a batch and has pre-committed its epoch's ack marker when
// the broker is SIGKILLed and restarted (the chaos round: a task manager
// killed, the broker 1.2 s later, during the job's recovery). The
// checkpoint's outcome reaches the subtask after the restart:
//   - completed: the marker's commit must fail (the crash aborted its
//     transaction), so the job restores the checkpoint, whose recovery
//     re-commits the marker; the records come back and are recognised as
//     processed, none emitted again and none left without a committed
//     marker (the sink's output of the checkpoint is re-committed the same
//     way, internal/kafkatxn);
//   - aborted: the subtask rolls back, and the next attempt emits every
//     record once. No lane parks behind the lost marker.
//
// Either way every record ends up emitted once by an attempt whose
// checkpoint completed, or covered by a committed marker of a completed
// checkpoint.
func TestAMarkerTransactionTheBrokerCrashLostIsRecommittedOrRolledBackNeverSkipped(t *testing.T) {
	const n = 50
	tp := acklog.TopicPartition{Topic: "in", Partition: 0}
	for _, completed := range []bool{true, false} {
		t.Run(fmt.Sprintf("checkpoint completed=%v", completed), func(t *testing.T) {
			ctx := t.Context()
			c := startChainedBroker(t)
			env := c.input(t, n)
			newSrc := testSources(t, env)
			a, err := openFrom(t, newSrc, 0, 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := pollFor(t, a, n, 20*time.Second); len(got) != n {
				t.Fatalf("attempt 0 emitted %d records, want %d", len(got), n)
			}
			st, err := a.Snapshot(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			c.crash()

			var restored []checkpoint.TxnHandle
			if completed {
				if err := a.NotifyCheckpointComplete(ctx, 1); err == nil {
					t.Fatalf("the commit of checkpoint 1's ack marker succeeded after the broker crash that aborted its transaction: " +
						"its records would be acknowledged while the ack-log says nothing processed them")
				} else {
					t.Logf("attempt 0's commit after the crash: %v", err)
				}
				restored = st.Handles
			} else if err := a.NotifyCheckpointAborted(ctx, 1); err == nil {
				t.Fatal("checkpoint 1 aborted while holding its records, and the subtask did not roll back")
			}
			a.Close()

			b, err := openFrom(t, newSrc, 0, 1, restored)
			if err != nil {
				t.Fatalf("attempt 1 (restored handles: %d): %v", len(restored), err)
			}
			want := n
			if completed {
				want = 0
			}
			got := pollFor(t, b, want, 20*time.Second)
			if completed {
				// Redeliveries of checkpoint 1's records are recognised and
				// ACCEPTed, none emitted; wait for the share start to pass them.
				deadline := time.Now().Add(20 * time.Second)
				for shareStart(t, env, "g", tp) < n && time.Now().Before(deadline) {
					got = append(got, pollFor(t, b, 1, 200*time.Millisecond)...)
				}
				if len(got) > 0 {
					t.Fatalf("attempt 1 emitted %d records of completed checkpoint 1 again: %v", len(got), got)
				}
				if s := shareStart(t, env, "g", tp); s < n {
					t.Fatalf("share start offset %d, want %d: checkpoint 1's records were neither recognised nor emitted", s, n)
				}
				cover := committedCover(ackLogEntries(t, env, "g"), tp)
				for i := range n {
					if cover[i] == 0 {
						t.Fatalf("offset %d was acknowledged without a committed ack marker covering it; markers:\n%s",
							i, describeMarkers(ackLogEntries(t, env, "g")))
					}
				}
				return
			}
			if msg := exactlyOnce(counts(t, got), n); msg != "" {
				t.Fatalf("attempt 1 after the rollback: %s", msg)
			}
		})
	}
}

// TestRecordsHeldByTwoEndedAttemptsAndABrokerCrashAreEachProcessedOnce: the
// chaos round's delivery history of the backlog. The attempt the task
// manager's kill ended emitted the records (one delivery, released); the
// attempt after it held them, its marker pre-committed, when the broker was
// killed (a second delivery); the attempt after the restart reads them
// again. That third delivery would be where the source re-queues a record no
// committed marker covers (restartBurn), but the crash loses the broker's
// share state and its delivery counts: the repair redelivers every record
// from the journaled start once, so the next attempt gets them at delivery
// count 2 and processes the originals (measured here: the ack-log holds no
// re-queue marker). Every record must come out once, and the share start
// offset must pass them.
func TestRecordsHeldByTwoEndedAttemptsAndABrokerCrashAreEachProcessedOnce(t *testing.T) {
	const n = 50
	ctx := t.Context()
	c := startChainedBroker(t)
	env := c.input(t, n)
	newSrc := testSources(t, env)
	// Attempt 0 is the one the task manager's kill ended: its batch is
	// released (one delivery).
	a, err := openFrom(t, newSrc, 0, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := pollFor(t, a, n, 20*time.Second); len(got) != n {
		t.Fatalf("attempt 0 emitted %d records, want %d", len(got), n)
	}
	a.Close()
	// Attempt 1 holds them (the second delivery) with its marker
	// pre-committed when the broker is killed.
	b, err := openFrom(t, newSrc, 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := pollFor(t, b, n, 20*time.Second); len(got) != n {
		t.Fatalf("attempt 1 emitted %d records, want %d", len(got), n)
	}
	if _, err := b.Snapshot(ctx, 1); err != nil {
		t.Fatal(err)
	}
	c.crash()
	if err := b.NotifyCheckpointAborted(ctx, 1); err == nil {
		t.Fatal("checkpoint 1 aborted while holding its records, and the subtask did not roll back")
	}
	b.Close()

	// Attempt 2: the records come back and are processed once.
	d, err := openFrom(t, newSrc, 0, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := pollFor(t, d, n, 30*time.Second)
	if msg := exactlyOnce(counts(t, got), n); msg != "" {
		t.Fatalf("attempt 2 after the broker crash: %s", msg)
	}
	if _, err := d.Snapshot(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := d.NotifyCheckpointComplete(ctx, 2); err != nil {
		t.Fatal(err)
	}
	tp := acklog.TopicPartition{Topic: "in", Partition: 0}
	deadline := time.Now().Add(20 * time.Second)
	for shareStart(t, env, "g", tp) < n && time.Now().Before(deadline) {
		if more := pollFor(t, d, 1, 200*time.Millisecond); len(more) > 0 {
			t.Fatalf("attempt 2 emitted %v again", more)
		}
	}
	if s := shareStart(t, env, "g", tp); s < n {
		t.Fatalf("share start offset of in[0] is %d, want %d", s, n)
	}
	t.Logf("ack-log:\n%s", describeMarkers(ackLogEntries(t, env, "g")))
}

// TestALaneParkedBehindAMarkerTheBrokerCrashLostResumes: explanation (A) of
// the chained job's loss is a lane that sets records aside behind an open
// ack marker of its own job that never ends, and parks for good. Here a
// process holding 50 records with its marker pre-committed is SIGKILLed (its
// records are released at once, its transaction stays open), a subtask of
// the same job gets them and sets them aside behind that marker (a marker of
// its own job: it never aborts it), and then the broker is SIGKILLed and
// restarted: the repair aborts the open transaction with a lost-state
// marker, and the parked lane must resolve, take the records again and emit
// each once.
func TestALaneParkedBehindAMarkerTheBrokerCrashLostResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	const n = 50
	c := startChainedBroker(t)
	env := c.input(t, n)
	killChildHoldingRecords(t, env) // subtask 0 of a one-subtask attempt: transactional ids weir-job-src-0-*

	// Subtask 1 (of 2) does not recover subtask 0's ids: the marker stays open.
	b, err := openFrom(t, testSources(t, env), 1, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for !parked(b) && time.Now().Before(deadline) {
		if got := pollFor(t, b, 1, 100*time.Millisecond); len(got) > 0 {
			t.Fatalf("emitted %v, covered by the killed process's open marker", got)
		}
	}
	if !parked(b) {
		t.Fatal("no lane set the records aside behind the killed process's open marker")
	}
	c.crash()
	got := pollFor(t, b, n, 30*time.Second)
	if msg := exactlyOnce(counts(t, got), n); msg != "" {
		t.Fatalf("after the broker crash: %s", msg)
	}
}
