package sharegroup

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kversion"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// sliceCollector collects emitted values.
type sliceCollector struct{ vals []string }

func (c *sliceCollector) Collect(v string) { c.vals = append(c.vals, v) }

func produceN(t *testing.T, env *kafkatest.Env, topic string, n int) {
	t.Helper()
	cl := env.Client(t, kgo.DefaultProduceTopic(topic))
	var recs []*kgo.Record
	for i := 0; i < n; i++ {
		recs = append(recs, kgo.StringRecord(strconv.Itoa(i)))
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// openSource opens subtask sub of a source the test drives by hand.
func openSource(t *testing.T, env *kafkatest.Env, sub int, commit []checkpoint.TxnHandle, opts ...Opt) *Source[string] {
	t.Helper()
	s, err := openSourceErr(t, env, sub, commit, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// openSourceErr is openSource returning Open's error (the source is closed
// on cleanup either way).
func openSourceErr(t *testing.T, env *kafkatest.Env, sub int, commit []checkpoint.TxnHandle, opts ...Opt) (*Source[string], error) {
	t.Helper()
	return openFrom(t, testSources(t, env, opts...), sub, 0, commit)
}

// testSources returns the factory of a source the tests drive by hand, one
// lane and batches of 100 unless opts say otherwise. A job's deployment
// makes every subtask of every attempt from one factory.
func testSources(t *testing.T, env *kafkatest.Env, opts ...Opt) func() runtime.Source[string] {
	t.Helper()
	newSrc, err := New(func(r *kgo.Record) (string, error) {
		if string(r.Value) == "poison" {
			return "", errors.New("not a number")
		}
		return string(r.Value), nil
	}, append([]Opt{Brokers(env.Addr), Topics("in"), Group("g"), Lanes(1), BatchSize(100)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return newSrc
}

// openFrom opens subtask sub (of 2) of the given attempt from newSrc and
// returns Open's error (the source is closed on cleanup either way).
func openFrom(t *testing.T, newSrc func() runtime.Source[string], sub, attempt int, commit []checkpoint.TxnHandle) (*Source[string], error) {
	t.Helper()
	s := newSrc().(*Source[string])
	oc := &runtime.OperatorContext{Job: "job", Name: "src", UID: "src", Subtask: sub, Parallelism: 2, Attempt: attempt,
		CommitHandles: commit, Logger: testLogger(t)}
	t.Cleanup(func() { s.Close() })
	return s, s.Open(t.Context(), oc)
}

// pollFor polls until at least n values were emitted or the deadline passes.
func pollFor(t *testing.T, s *Source[string], n int, within time.Duration) []string {
	t.Helper()
	c := &sliceCollector{}
	deadline := time.Now().Add(within)
	for len(c.vals) < n && time.Now().Before(deadline) {
		if err := s.Poll(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	return c.vals
}

// A zombie: lane A's lock expires while it works, the broker redelivers the
// records to lane B, B commits first. A's conflict check must decline, so
// exactly one of them commits. Lapse detection by A's own clock is switched
// off (negative margin) to exercise the conflict check alone.
//
// Each subtask runs two lanes, and B renews its locks as the defaults do.
func TestZombieLaneLosesToTheFirstCommittedMarker(t *testing.T) {
	for _, bCommits := range []bool{true, false} {
		t.Run(fmt.Sprintf("earlier marker committed=%v", bCommits), func(t *testing.T) {
			env := kafkatest.New(t, broker.Config("group.share.record.lock.duration.ms", "1500"),
				broker.Config("share.record.lock.sweep.interval.ms", "100"))
			env.CreateTopic(t, "in", 1, nil)
			produceN(t, env, "in", 20)
			a := openSource(t, env, 0, nil, noLockClock, pausedOpt, Lanes(2)) // A renews nothing: it is paused
			got := pollFor(t, a, 20, 10*time.Second)
			if len(got) != 20 {
				t.Fatalf("lane A got %d records, want 20", len(got))
			}
			// A stalls past its lock; B gets the same records.
			time.Sleep(2500 * time.Millisecond)
			b := openSource(t, env, 1, nil, noLockClock, Lanes(2))
			again := pollFor(t, b, 20, 10*time.Second)
			if len(again) != 20 {
				t.Fatalf("lane B got %d redelivered records, want 20", len(again))
			}
			st, err := b.Snapshot(context.Background(), 1)
			if err != nil {
				t.Fatalf("B's checkpoint: %v", err)
			}
			if bCommits {
				if err := b.NotifyCheckpointComplete(context.Background(), 1); err != nil {
					t.Fatal(err)
				}
			}
			// The zombie A now reaches its barrier.
			_, err = a.Snapshot(context.Background(), 2)
			if !errors.Is(err, checkpoint.ErrDeclined) {
				t.Fatalf("zombie A's checkpoint: got %v, want a decline", err)
			}
			if !bCommits && len(st.Handles) == 0 {
				t.Fatal("B pre-committed nothing")
			}
			// The declined checkpoint aborts: A's marker is aborted and
			// the job rolls back.
			if err := a.NotifyCheckpointAborted(context.Background(), 2); !errors.Is(err, ErrRolledBack) {
				t.Fatalf("A on abort: got %v, want ErrRolledBack", err)
			}
		})
	}
}

func TestAbortReleasesRecordsAtOnce(t *testing.T) {
	env := kafkatest.New(t) // default 30 s locks: only a release brings them back quickly
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", 10)
	a := openSource(t, env, 0, nil)
	if got := pollFor(t, a, 10, 10*time.Second); len(got) != 10 {
		t.Fatalf("got %d records, want 10", len(got))
	}
	if _, err := a.Snapshot(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if err := a.NotifyCheckpointAborted(context.Background(), 1); !errors.Is(err, ErrRolledBack) {
		t.Fatalf("abort of a checkpoint holding records: got %v, want ErrRolledBack (the job must roll back)", err)
	}
	a.Close() // the task fails and closes its source
	start := time.Now()
	b := openSource(t, env, 1, nil)
	if got := pollFor(t, b, 10, 5*time.Second); len(got) != 10 {
		t.Fatalf("after the abort another lane got %d records within 5s, want all 10", len(got))
	}
	t.Logf("records back after %v", time.Since(start))
}

func TestPoisonRecordsGoToTheDeadLetterTopicInTheTransaction(t *testing.T) {
	for _, mode := range []AckMode{Transactional, AtLeastOnce} {
		t.Run(mode.String(), func(t *testing.T) { testPoison(t, mode) })
	}
}

func testPoison(t *testing.T, mode AckMode) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 1, nil)
	cl := env.Client(t, kgo.DefaultProduceTopic("in"))
	if err := cl.ProduceSync(context.Background(), kgo.StringRecord("1"), kgo.StringRecord("poison"), kgo.StringRecord("2")).FirstErr(); err != nil {
		t.Fatal(err)
	}
	a := openSource(t, env, 0, nil, DeadLetterTopic("dlq"), Mode(mode))
	got := pollFor(t, a, 2, 10*time.Second)
	if len(got) != 2 {
		t.Fatalf("emitted %v, want the 2 good records", got)
	}
	if n := len(env.ReadCommitted(t, "dlq")); n != 0 && mode == Transactional {
		t.Fatalf("dead letter visible before its checkpoint committed (%d records)", n)
	}
	if _, err := a.Snapshot(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if err := a.NotifyCheckpointComplete(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	dlq := env.ReadCommitted(t, "dlq")
	if len(dlq) != 1 || string(dlq[0].Value) != "poison" {
		t.Fatalf("dead-letter topic holds %d records, want the poison record once", len(dlq))
	}
	hdr := map[string]string{}
	for _, h := range dlq[0].Headers {
		hdr[h.Key] = string(h.Value)
	}
	if hdr[HeaderTopic] != "in" || hdr[HeaderOffset] != "1" || hdr[HeaderDeliveryCount] != "1" || hdr[HeaderError] == "" {
		t.Fatalf("dead-letter headers %v", hdr)
	}
}

func TestRedeliveryAfterCommitIsAcceptedNotEmitted(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", 10)
	a := openSource(t, env, 0, nil)
	if got := pollFor(t, a, 10, 10*time.Second); len(got) != 10 {
		t.Fatalf("got %d, want 10", len(got))
	}
	st, err := a.Snapshot(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	// The checkpoint completes, but the process dies before the broker
	// ACCEPT: the marker transaction is committed on restore instead.
	a.Close()
	b := openSource(t, env, 0, st.Handles)
	// The marker names its transaction, so others can match it (and, if
	// stale, abort it).
	logged := markersIn(env.ReadCommitted(t, acklog.TopicFor("g")))
	if len(logged) != 1 || len(st.Handles) != 1 {
		t.Fatalf("ack-log holds %d committed markers for %d handles, want 1 and 1", len(logged), len(st.Handles))
	}
	m, err := acklog.Decode(logged[0])
	if err != nil {
		t.Fatal(err)
	}
	if h := st.Handles[0]; m.TransactionalID != h.TransactionalID || m.ProducerID != h.ProducerID || m.Checkpoint != 1 {
		t.Fatalf("marker names %s/%d checkpoint %d, want %s/%d checkpoint 1", m.TransactionalID, m.ProducerID, m.Checkpoint,
			h.TransactionalID, h.ProducerID)
	}
	if got := pollFor(t, b, 1, 3*time.Second); len(got) != 0 {
		t.Fatalf("records covered by a committed marker were emitted again: %v", got)
	}
	produceN(t, env, "in", 1) // fresh data still flows
	if got := pollFor(t, b, 1, 10*time.Second); len(got) != 1 {
		t.Fatalf("new record not emitted: %v", got)
	}
}

func TestBrokerWithoutShareGroupsFailsFast(t *testing.T) {
	// A broker that speaks Kafka 3.9's APIs: no share groups.
	start := time.Now()
	err := openOnBroker(t, kversion.V3_9_0())
	if !errors.Is(err, ErrNoShareGroups) || !errors.Is(err, runtime.ErrUnrecoverable) {
		t.Fatalf("got %v, want ErrNoShareGroups, unrecoverable (a restart cannot help)", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("took %v to refuse: not fast", el)
	}
}

func TestUnreachableBrokersGiveAClearError(t *testing.T) {
	newSrc, err := New(func(r *kgo.Record) (string, error) { return "", nil }, Brokers("127.0.0.1:1"), Topics("in"), Group("g"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	s := newSrc()
	err = s.Open(ctx, &runtime.OperatorContext{Job: "j", UID: "s", Parallelism: 1, Logger: zap.NewNop()})
	s.Close()
	if err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("got %v, want an error saying the brokers are unreachable", err)
	}
}

func TestBadOptionsAreRefused(t *testing.T) {
	dec := func(r *kgo.Record) (string, error) { return "", nil }
	cases := []struct {
		name string
		opts []Opt
	}{
		{"no brokers", []Opt{Topics("t"), Group("g")}},
		{"no topics", []Opt{Brokers("b"), Group("g")}},
		{"no group", []Opt{Brokers("b"), Topics("t")}},
		{"max deliveries 1", []Opt{Brokers("b"), Topics("t"), Group("g"), MaxDeliveries(1)}},
		{"negative batch", []Opt{Brokers("b"), Topics("t"), Group("g"), BatchSize(-1)}},
		{"negative idle-commit time", []Opt{Brokers("b"), Topics("t"), Group("g"), CommitWhenIdle(-time.Millisecond)}},
		{"a transactional-id prefix ending with the re-queue suffix", []Opt{Brokers("b"), Topics("t"), Group("g"), TransactionalIDPrefix("a-rq")}},
		{"a frontier interval of 0", []Opt{Brokers("b"), Topics("t"), Group("g"), FrontierInterval(0)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(dec, tc.opts...); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("got %v, want ErrInvalidConfig", err)
			}
		})
	}
}

func testLogger(t *testing.T) *zap.Logger {
	if testing.Verbose() {
		return zap.NewExample(zap.IncreaseLevel(zap.DebugLevel))
	}
	return zap.NewNop()
}

// A lane that, by its own clock, may have let its locks lapse declines before
// it writes a marker (the second line of defence behind the conflict check).
func TestLaneThatMayHaveLostItsLocksDeclines(t *testing.T) {
	env := kafkatest.New(t, broker.Config("group.share.record.lock.duration.ms", "1200"),
		broker.Config("share.record.lock.sweep.interval.ms", "100"))
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", 5)
	a := openSource(t, env, 0, nil, pausedOpt)
	if got := pollFor(t, a, 5, 10*time.Second); len(got) != 5 {
		t.Fatalf("got %d, want 5", len(got))
	}
	time.Sleep(1200 * time.Millisecond)
	if _, err := a.Snapshot(context.Background(), 1); !errors.Is(err, checkpoint.ErrDeclined) {
		t.Fatalf("got %v, want a decline", err)
	}
}

// Markers whose records are all done (below the share start offset) are
// tombstoned once the grace period passed, so the ack-log stays small.
func TestDoneMarkersAreTombstonedAfterTheGracePeriod(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", 10)
	a := openSource(t, env, 0, nil, MarkerGrace(100*time.Millisecond), withCfg(func(c *cfg) { c.tombstoneEvery, c.checkEvery = 50*time.Millisecond, 50*time.Millisecond }))
	if got := pollFor(t, a, 10, 10*time.Second); len(got) != 10 {
		t.Fatalf("got %d, want 10", len(got))
	}
	if _, err := a.Snapshot(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if err := a.NotifyCheckpointComplete(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	live := func() int {
		ix, err := acklog.NewIndex(context.Background(), []string{env.Addr}, acklog.TopicFor("g"))
		if err != nil {
			t.Fatal(err)
		}
		defer ix.Close()
		if err := ix.CatchUpToEnd(context.Background()); err != nil {
			t.Fatal(err)
		}
		return ix.Len()
	}
	if n := live(); n != 1 {
		t.Fatalf("%d live markers after the commit, want 1", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for live() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the done marker was never tombstoned")
		}
		pollFor(t, a, 1, 100*time.Millisecond) // the source collects while polling
	}
}

// What a failure before any checkpoint completed means in each mode:
// implicit has acknowledged what it emitted (lost to the job: at-most-once),
// the others get every record again.
func TestModesOnAFailureBeforeTheCheckpoint(t *testing.T) {
	cases := []struct {
		mode      AckMode
		redeliver bool
	}{
		{Implicit, false},
		{AtLeastOnce, true},
		{Transactional, true},
	}
	for _, tc := range cases {
		t.Run(tc.mode.String(), func(t *testing.T) {
			env := kafkatest.New(t)
			env.CreateTopic(t, "in", 1, nil)
			produceN(t, env, "in", 10)
			a := openSource(t, env, 0, nil, Mode(tc.mode))
			if got := pollFor(t, a, 10, 10*time.Second); len(got) != 10 {
				t.Fatalf("got %d, want 10", len(got))
			}
			a.Close() // the task fails before checkpoint 1 completes
			b := openSource(t, env, 0, nil, Mode(tc.mode))
			want := 0
			if tc.redeliver {
				want = 10
			}
			if got := pollFor(t, b, 10, 2*time.Second); len(got) != want {
				t.Fatalf("after the failure %d records came back, want %d", len(got), want)
			}
		})
	}
}

// markersIn keeps the ack markers of ack-log records (not watermarks).
func markersIn(recs []*kgo.Record) []*kgo.Record {
	var out []*kgo.Record
	for _, r := range recs {
		if _, err := acklog.Decode(r); err == nil {
			out = append(out, r)
		}
	}
	return out
}

// A source opening an ack-log whose tombstones go sooner than
// acklog.DeleteRetention (made before Weir set it, or by hand) warns, once
// (subtask 0), and runs on; on the ack-log it creates itself it does not.
func TestASourceWarnsOfAnAckLogThatDropsTombstonesTooSoon(t *testing.T) {
	for _, tc := range []struct {
		name     string
		existing bool
	}{{"an ack-log made with Kafka's default", true}, {"the ack-log the source creates", false}} {
		t.Run(tc.name, func(t *testing.T) {
			env := kafkatest.New(t)
			env.CreateTopic(t, "in", 1, nil)
			produceN(t, env, "in", 1)
			if tc.existing {
				adm := kadm.NewClient(env.Client(t))
				if _, err := adm.CreateTopic(t.Context(), 1, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("compact")}, acklog.TopicFor("g")); err != nil {
					t.Fatal(err)
				}
			}
			core, logs := observer.New(zapcore.WarnLevel)
			s := testSources(t, env)().(*Source[string])
			oc := &runtime.OperatorContext{Job: "job", Name: "src", UID: "src", Subtask: 0, Parallelism: 1, Logger: zap.New(core)}
			t.Cleanup(func() { s.Close() })
			if err := s.Open(t.Context(), oc); err != nil {
				t.Fatal(err)
			}
			warned := logs.FilterMessage("the ack-log's tombstones are deleted too soon for the savepoint restore check").All()
			if tc.existing && (len(warned) != 1 || !strings.Contains(fmt.Sprint(warned[0].ContextMap()["error"]), "keeps tombstones 24h0m0s, Weir needs 168h0m0s")) {
				t.Errorf("warnings %v; want one saying the ack-log keeps tombstones a day where Weir needs a week", logs.All())
			}
			if !tc.existing && logs.Len() != 0 {
				t.Errorf("warnings %v on the ack-log the source created; want none", logs.All())
			}
		})
	}
}
