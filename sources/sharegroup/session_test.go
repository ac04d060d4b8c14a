package sharegroup

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// sessEnv starts a broker for session tests: fast heartbeats and lock
// sweeps, a delivery limit high enough that the redeliveries these tests
// cause never archive a record, and lockMs as the record lock duration (0:
// Kafka's 30 s).
func sessEnv(t *testing.T, lockMs int) *kafkatest.Env {
	t.Helper()
	opts := []broker.Opt{
		broker.Config("group.share.heartbeat.interval.ms", "200"),
		broker.Config("share.record.lock.sweep.interval.ms", "100"),
		broker.Config("group.share.delivery.count.limit", "10"),
	}
	if lockMs > 0 {
		opts = append(opts, broker.Config("group.share.record.lock.duration.ms", strconv.Itoa(lockMs)))
	}
	return kafkatest.New(t, opts...)
}

func sessCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// sessInputs creates topic and produces n records k000.. / v000...
func sessInputs(t *testing.T, env *kafkatest.Env, topic string, partitions int32, n int) {
	t.Helper()
	env.CreateTopic(t, topic, partitions, nil)
	rs := make([]*kgo.Record, 0, n)
	for i := range n {
		rs = append(rs, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%03d", i), Value: fmt.Appendf(nil, "v%03d", i)})
	}
	if err := env.Client(t).ProduceSync(sessCtx(t, 20*time.Second), rs...).FirstErr(); err != nil {
		t.Fatalf("produce inputs: %v", err)
	}
}

// sessOpen opens a session on env (closed on cleanup) with a 20 s
// transaction timeout and a 1 s open-marker wait unless opts override them.
func sessOpen(t *testing.T, env *kafkatest.Env, group, in, txnID string, opts ...Opt) *Session {
	t.Helper()
	all := append([]Opt{Brokers(env.Addr), Group(group), Topics(in),
		TransactionalID(txnID), TransactionTimeout(20 * time.Second),
		OpenMarkerWait(time.Second), Logger(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)))}, opts...)
	s, err := NewSession(sessCtx(t, 20*time.Second), all...)
	if err != nil {
		t.Fatalf("NewSession(%s): %v", txnID, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close(%s): %v", txnID, err)
		}
	})
	return s
}

// sessOutput is the mirrored record of r: same key, value "M:"+value, and
// headers naming the session and the input record.
func sessOutput(s *Session, out string, r *kgo.Record) *kgo.Record {
	return &kgo.Record{Topic: out, Key: r.Key, Value: append([]byte("M:"), r.Value...), Headers: []kgo.RecordHeader{
		{Key: "session", Value: []byte(s.TransactionalID())},
		{Key: "src", Value: fmt.Appendf(nil, "%s/%d/%d", r.Topic, r.Partition, r.Offset)},
	}}
}

func sessProduceAll(t *testing.T, ctx context.Context, s *Session, out string, recs []*kgo.Record) {
	t.Helper()
	for _, r := range recs {
		if err := s.Produce(ctx, sessOutput(s, out, r)); err != nil {
			t.Fatalf("Produce: %v", err)
		}
	}
}

// sessLedger records which input offsets committed transactions covered.
type sessLedger struct {
	mu   sync.Mutex
	done map[string]int // "partition/offset" -> commits
	max  map[string]int32
}

func newSessLedger() *sessLedger {
	return &sessLedger{done: make(map[string]int), max: make(map[string]int32)}
}

func sessID(r *kgo.Record) string { return fmt.Sprintf("%d/%d", r.Partition, r.Offset) }

func (l *sessLedger) committed(recs []*kgo.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range recs {
		l.done[sessID(r)]++
	}
}

func (l *sessLedger) seen(recs []*kgo.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range recs {
		l.max[sessID(r)] = max(l.max[sessID(r)], r.DeliveryCount())
	}
}

func (l *sessLedger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.done)
}

// sessMirror runs the poll / produce / commit loop on s until the ledger
// holds n input records or ctx ends. Conflicts are retried.
func sessMirror(ctx context.Context, s *Session, out string, n int, l *sessLedger) error {
	for l.count() < n {
		pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		recs, err := s.Poll(pctx)
		cancel()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				continue
			}
			return fmt.Errorf("%s: Poll: %w", s.TransactionalID(), err)
		}
		l.seen(recs)
		for _, r := range recs {
			if err := s.Produce(ctx, sessOutput(s, out, r)); err != nil {
				return fmt.Errorf("%s: Produce: %w", s.TransactionalID(), err)
			}
		}
		switch err := s.Commit(ctx); {
		case err == nil:
			l.committed(recs)
		case errors.Is(err, ErrConflict):
		default:
			return fmt.Errorf("%s: Commit: %w", s.TransactionalID(), err)
		}
	}
	return nil
}

// sessCheckOutputs asserts that out holds, read_committed, exactly one
// mirrored record per input k000..k(n-1), and returns input key -> the
// session that wrote its output.
func sessCheckOutputs(t *testing.T, env *kafkatest.Env, out string, n int) map[string]string {
	t.Helper()
	recs := env.ReadCommitted(t, out)
	count := make(map[string]int)
	from := make(map[string]string)
	for _, r := range recs {
		k := string(r.Key)
		count[k]++
		if want := "M:v" + k[1:]; string(r.Value) != want {
			t.Errorf("output for %s has value %q, want %q", k, r.Value, want)
		}
		for _, h := range r.Headers {
			if h.Key == "session" {
				from[k] = string(h.Value)
			}
		}
	}
	for i := range n {
		if k := fmt.Sprintf("k%03d", i); count[k] != 1 {
			t.Errorf("input %s has %d committed outputs, want exactly 1", k, count[k])
		}
	}
	if len(recs) != n {
		t.Errorf("%d committed outputs, want %d", len(recs), n)
	}
	return from
}

// sessAssertAllAcked asserts that every record of topic is acknowledged in
// the share group: each partition's share start offset reached its end.
func sessAssertAllAcked(t *testing.T, env *kafkatest.Env, group, topic string) {
	t.Helper()
	ctx := sessCtx(t, 10*time.Second)
	adm := env.Admin(t)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("ListEndOffsets: %v", err)
	}
	ds, err := adm.DescribeShareGroupOffsets(ctx, group)
	if err != nil {
		t.Fatalf("DescribeShareGroupOffsets: %v", err)
	}
	ends.Each(func(e kadm.ListedOffset) {
		if e.Offset == 0 {
			return
		}
		so, ok := ds[group].Offsets.Lookup(topic, e.Partition)
		if !ok || so.StartOffset != e.Offset {
			t.Errorf("share group %s, %s[%d]: share start offset %d (found %v), want %d: records left unacknowledged",
				group, topic, e.Partition, so.StartOffset, ok, e.Offset)
		}
	})
}

// sessAwaitLockExpiry sleeps until the locks of recs have expired and the
// broker's sweep returned them.
func sessAwaitLockExpiry(recs []*kgo.Record) {
	var last time.Time
	for _, r := range recs {
		if dl := r.AcquisitionDeadline(); dl.After(last) {
			last = dl
		}
	}
	time.Sleep(time.Until(last) + 700*time.Millisecond)
}

// sessTxnState returns the coordinator's state of a transactional id.
func sessTxnState(t *testing.T, env *kafkatest.Env, id string) string {
	t.Helper()
	ds, err := env.Admin(t).DescribeTransactions(sessCtx(t, 10*time.Second), id)
	if err != nil {
		t.Fatalf("DescribeTransactions(%s): %v", id, err)
	}
	return ds[id].State
}

func TestSessionOptionsAreValidatedBeforeConnecting(t *testing.T) {
	base := []Opt{Brokers("127.0.0.1:1"), Group("g"), Topics("in")}
	for _, tc := range []struct {
		name string
		opts []Opt
	}{
		{"no brokers", []Opt{Brokers(), Group("g"), Topics("in")}},
		{"no topics", []Opt{Brokers("127.0.0.1:1"), Group("g")}},
		{"no group", []Opt{Brokers("127.0.0.1:1"), Topics("in")}},
		{"zero max records", append(base, BatchSize(0))},
		{"zero transaction timeout", append(base, TransactionTimeout(0))},
		{"negative open-marker wait", append(base, OpenMarkerWait(-time.Second))},
		{"transaction timeout not above the wait", append(base, TransactionTimeout(time.Second), OpenMarkerWait(time.Second))},
		{"negative lock margin", append(base, LockMargin(-time.Second))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewSession(context.Background(), tc.opts...)
			if !errors.Is(err, ErrInvalidConfig) {
				if s != nil {
					s.Close()
				}
				t.Fatalf("NewSession: %v, want an error wrapping ErrInvalidConfig", err)
			}
		})
	}
}

func TestSessionRefusesMisuse(t *testing.T) {
	env := sessEnv(t, 0)
	sessInputs(t, env, "in", 1, 3)
	ctx := sessCtx(t, 30*time.Second)

	if _, err := NewSession(ctx, Brokers(env.Addr), Group("g"), Topics("missing")); !errors.Is(err, kerr.UnknownTopicOrPartition) {
		t.Errorf("NewSession on a missing topic: %v, want UNKNOWN_TOPIC_OR_PARTITION", err)
	}

	s := sessOpen(t, env, "g", "in", "misuse")
	recs, err := s.Poll(ctx)
	if err != nil || len(recs) == 0 {
		t.Fatalf("Poll: %d records, %v", len(recs), err)
	}
	if _, err := s.Poll(ctx); !errors.Is(err, ErrBatchOpen) {
		t.Errorf("Poll with a batch open: %v, want ErrBatchOpen", err)
	}
	foreign := &kgo.Record{Topic: "in", Value: []byte("x")}
	if err := s.Reject(ctx, foreign, errors.New("bad"), ""); !errors.Is(err, ErrNotInBatch) {
		t.Errorf("Reject of a foreign record: %v, want ErrNotInBatch", err)
	}
	if err := s.Abort(ctx); err != nil {
		t.Fatalf("Abort: %v", err)
	}
	if err := s.Reject(ctx, recs[0], errors.New("bad"), ""); !errors.Is(err, ErrNotInBatch) {
		t.Errorf("Reject after Abort: %v, want ErrNotInBatch", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := s.Poll(ctx); !errors.Is(err, ErrSessionClosed) {
		t.Errorf("Poll after Close: %v, want ErrSessionClosed", err)
	}
	if err := s.Produce(ctx, &kgo.Record{Topic: "in"}); !errors.Is(err, ErrSessionClosed) {
		t.Errorf("Produce after Close: %v, want ErrSessionClosed", err)
	}
	if err := s.Commit(ctx); !errors.Is(err, ErrSessionClosed) {
		t.Errorf("Commit after Close: %v, want ErrSessionClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestSessionMirrorLoopOutputsEachInputExactlyOnce(t *testing.T) {
	const n, sessions = 600, 3
	env := sessEnv(t, 0)
	sessInputs(t, env, "in", 4, n)
	env.CreateTopic(t, "out", 4, nil)
	ctx := sessCtx(t, 40*time.Second)

	l := newSessLedger()
	errs := make(chan error, sessions)
	for i := range sessions {
		s := sessOpen(t, env, "mirror", "in", fmt.Sprintf("mirror-%d", i), BatchSize(40))
		go func() { errs <- sessMirror(ctx, s, "out", n, l) }()
	}
	for range sessions {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	l.mu.Lock()
	for id, c := range l.done {
		if c != 1 {
			t.Errorf("input %s committed %d times", id, c)
		}
	}
	l.mu.Unlock()
	from := sessCheckOutputs(t, env, "out", n)
	writers := make(map[string]int)
	for _, s := range from {
		writers[s]++
	}
	t.Logf("outputs per session: %v", writers)
	sessAssertAllAcked(t, env, "mirror", "in")
}

func TestSessionCrashBeforeCommitLeavesNothingVisible(t *testing.T) {
	const n = 30
	env := sessEnv(t, 2000)
	sessInputs(t, env, "in", 2, n)
	env.CreateTopic(t, "out", 2, nil)
	ctx := sessCtx(t, 40*time.Second)

	// A writes its outputs and its marker, passes the conflict check, and
	// dies before EndTxn: its transaction stays open (20 s timeout).
	a := sessOpen(t, env, "crash", "in", "crash-a")
	recs, err := a.Poll(ctx)
	if err != nil || len(recs) == 0 {
		t.Fatalf("A: Poll: %d records, %v", len(recs), err)
	}
	sessProduceAll(t, ctx, a, "out", recs)
	a.hook = func(p sessPoint) bool { return p == sessAfterMarker }
	if err := a.Commit(ctx); !errors.Is(err, errSessCrashed) {
		t.Fatalf("A: Commit: %v, want the crash", err)
	}
	if st := sessTxnState(t, env, "crash-a"); st != "Ongoing" {
		t.Fatalf("A's transaction is %q after the crash, want Ongoing", st)
	}

	// B finds A's records covered by A's open marker, sets them aside,
	// waits 1 s, aborts A's stale transaction, and processes them next.
	b := sessOpen(t, env, "crash", "in", "crash-b")
	l := newSessLedger()
	if err := sessMirror(ctx, b, "out", n, l); err != nil {
		t.Fatal(err)
	}
	if st := sessTxnState(t, env, "crash-a"); st == "Ongoing" {
		t.Errorf("A's stale transaction is still open after B committed everything")
	}
	for _, r := range recs {
		if dc := l.max[sessID(r)]; dc < 2 {
			t.Errorf("record %s that A held came to B with delivery count %d, want a redelivery", sessID(r), dc)
		}
	}
	for k, s := range sessCheckOutputs(t, env, "out", n) {
		if s != "crash-b" {
			t.Errorf("output of %s was written by %s: A's aborted outputs must never be visible", k, s)
		}
	}
	sessAssertAllAcked(t, env, "crash", "in")
}

func TestSessionCrashAfterCommitRedeliveryIsAcceptedNotReturned(t *testing.T) {
	const n = 20
	env := sessEnv(t, 2000)
	sessInputs(t, env, "in", 1, n)
	env.CreateTopic(t, "out", 1, nil)
	ctx := sessCtx(t, 40*time.Second)

	// A commits its transaction and dies before ACCEPTing the records.
	a := sessOpen(t, env, "acc", "in", "acc-a")
	recs, err := a.Poll(ctx)
	if err != nil || len(recs) == 0 {
		t.Fatalf("A: Poll: %d records, %v", len(recs), err)
	}
	sessProduceAll(t, ctx, a, "out", recs)
	a.hook = func(p sessPoint) bool { return p == sessAfterCommit }
	if err := a.Commit(ctx); !errors.Is(err, errSessCrashed) {
		t.Fatalf("A: Commit: %v, want the crash", err)
	}
	byA := make(map[string]bool)
	for _, r := range recs {
		byA[sessID(r)] = true
	}

	// B gets A's records again (A's close released them) and must accept
	// them without returning them; it processes only the rest.
	b := sessOpen(t, env, "acc", "in", "acc-b")
	l := newSessLedger()
	l.committed(recs) // A's
	if err := sessMirror(ctx, b, "out", n, l); err != nil {
		t.Fatal(err)
	}
	// Past a lock duration: nothing is left to deliver.
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	more, err := b.Poll(pctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("final Poll: %d records, %v; want none (deadline exceeded)", len(more), err)
	}
	for id := range l.max {
		if byA[id] {
			t.Errorf("B was handed %s, already processed by A's committed transaction", id)
		}
	}
	from := sessCheckOutputs(t, env, "out", n)
	for _, r := range recs {
		if s := from[string(r.Key)]; s != "acc-a" {
			t.Errorf("output of %s written by %q, want A's committed one", r.Key, s)
		}
	}
	sessAssertAllAcked(t, env, "acc", "in")
}

func TestSessionAbortReleasesRecordsAtOnce(t *testing.T) {
	const n = 10
	env := sessEnv(t, 0) // 30 s locks: only an explicit RELEASE brings them back within the test
	sessInputs(t, env, "in", 1, n)
	env.CreateTopic(t, "out", 1, nil)
	ctx := sessCtx(t, 30*time.Second)

	s := sessOpen(t, env, "abort", "in", "abort-a")
	first, err := s.Poll(ctx)
	if err != nil || len(first) == 0 {
		t.Fatalf("Poll: %d records, %v", len(first), err)
	}
	sessProduceAll(t, ctx, s, "out", first)
	if err := s.Abort(ctx); err != nil {
		t.Fatalf("Abort: %v", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	again, err := s.Poll(pctx)
	cancel()
	if err != nil {
		t.Fatalf("Poll after Abort: %v (the aborted records did not come back before their 30 s lock)", err)
	}
	redelivered := make(map[string]int32)
	for _, r := range again {
		redelivered[sessID(r)] = r.DeliveryCount()
	}
	for _, r := range first {
		if dc, ok := redelivered[sessID(r)]; !ok || dc != 2 {
			t.Errorf("aborted record %s: redelivered %v with delivery count %d, want at once with 2", sessID(r), ok, dc)
		}
	}
	sessProduceAll(t, ctx, s, "out", again)
	if err := s.Commit(ctx); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	l := newSessLedger()
	l.committed(again)
	if err := sessMirror(ctx, s, "out", n, l); err != nil {
		t.Fatal(err)
	}
	sessCheckOutputs(t, env, "out", n)
	sessAssertAllAcked(t, env, "abort", "in")
}

func TestSessionRejectSendsToDeadLetterInTheTransaction(t *testing.T) {
	const n = 4
	env := sessEnv(t, 0)
	sessInputs(t, env, "in", 1, n)
	env.CreateTopic(t, "out", 1, nil)
	env.CreateTopic(t, "dlq", 1, nil)
	ctx := sessCtx(t, 30*time.Second)

	s := sessOpen(t, env, "rej", "in", "rej-a", BatchSize(n))
	var recs []*kgo.Record
	for len(recs) < n {
		got, err := s.Poll(ctx)
		if err != nil {
			t.Fatalf("Poll: %v", err)
		}
		for _, r := range got {
			if string(r.Key) == "k001" {
				if err := s.Reject(ctx, r, errors.New("poison"), "dlq"); err != nil {
					t.Fatalf("Reject: %v", err)
				}
				continue
			}
			if err := s.Produce(ctx, sessOutput(s, "out", r)); err != nil {
				t.Fatalf("Produce: %v", err)
			}
		}
		if err := s.Commit(ctx); err != nil {
			t.Fatalf("Commit: %v", err)
		}
		recs = append(recs, got...)
	}
	dl := env.ReadCommitted(t, "dlq")
	if len(dl) != 1 || string(dl[0].Key) != "k001" {
		t.Fatalf("dead letters: %d records (%v), want exactly k001", len(dl), dl)
	}
	hs := make(map[string]string)
	for _, h := range dl[0].Headers {
		hs[h.Key] = string(h.Value)
	}
	if hs[HeaderError] != "poison" || hs[HeaderTopic] != "in" || hs[HeaderOffset] != "1" || hs[HeaderDeliveryCount] != "1" {
		t.Errorf("dead-letter headers %v", hs)
	}
	out := env.ReadCommitted(t, "out")
	if len(out) != n-1 {
		t.Errorf("%d outputs, want %d", len(out), n-1)
	}
	for _, r := range out {
		if string(r.Key) == "k001" {
			t.Errorf("the rejected record has an output")
		}
	}
	sessAssertAllAcked(t, env, "rej", "in") // the rejected record is archived, not redelivered
}

// TestSessionZombieCommitFailsWithConflict: a session whose locks expire
// while it works (a zombie) holds records another session then processes.
// The zombie's Commit must fail with ErrConflict and its outputs never
// become visible, however the two interleave; and when the other session
// dies with its marker open, the zombie may win after aborting it.
func TestSessionZombieCommitFailsWithConflict(t *testing.T) {
	const n = 5
	for _, tc := range []struct {
		name string
		// lapseCheck keeps the zombie's own-clock check on.
		lapseCheck bool
		// otherPaused holds B inside Commit (marker written, not
		// committed) until Z's marker follows; otherCrashes kills B there.
		otherPaused, otherCrashes bool
		wantZombieErr             bool
		wantLapsed                bool
	}{
		{name: "own clock declines before the marker", lapseCheck: true, wantZombieErr: true, wantLapsed: true},
		{name: "earlier committed marker wins", wantZombieErr: true},
		{name: "earlier open marker is waited for and wins", otherPaused: true, wantZombieErr: true},
		{name: "earlier open marker of a dead session is aborted", otherCrashes: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := sessEnv(t, 2000)
			sessInputs(t, env, "in", 1, n)
			env.CreateTopic(t, "out", 1, nil)
			ctx := sessCtx(t, 40*time.Second)
			group := "zombie"

			wait := time.Second
			if tc.otherPaused {
				wait = 15 * time.Second
			}
			z := sessOpen(t, env, group, "in", "zombie-z", RenewEvery(-1), OpenMarkerWait(wait))
			z.noLapseCheck = !tc.lapseCheck
			b := sessOpen(t, env, group, "in", "zombie-b")

			zr, err := z.Poll(ctx)
			if err != nil || len(zr) == 0 {
				t.Fatalf("Z: Poll: %d records, %v", len(zr), err)
			}
			sessProduceAll(t, ctx, z, "out", zr)
			sessAwaitLockExpiry(zr) // Z is paused; its locks lapse

			br, err := b.Poll(ctx)
			if err != nil {
				t.Fatalf("B: Poll: %v", err)
			}
			got := make(map[string]bool)
			for _, r := range br {
				got[sessID(r)] = true
			}
			for _, r := range zr {
				if !got[sessID(r)] {
					t.Fatalf("B did not get Z's expired record %s (got %d records)", sessID(r), len(br))
				}
			}
			sessProduceAll(t, ctx, b, "out", br)

			var zErr error
			switch {
			case tc.otherPaused:
				reached, proceed := make(chan struct{}), make(chan struct{})
				var once sync.Once
				release := func() { once.Do(func() { close(proceed) }) }
				t.Cleanup(release) // runs before the sessions' Close, even after a Fatal
				b.hook = func(p sessPoint) bool {
					if p == sessAfterMarker {
						close(reached)
						select {
						case <-proceed:
						case <-ctx.Done():
						}
					}
					return false
				}
				bErr := make(chan error, 1)
				go func() { bErr <- b.Commit(ctx) }()
				<-reached
				zDone := make(chan error, 1)
				go func() { zDone <- z.Commit(ctx) }()
				sessAwaitAckLogEnd(t, ctx, env, acklog.TopicFor(group), 2) // Z's marker is written after B's open one
				select {
				case err := <-zDone:
					t.Fatalf("Z: Commit returned (%v) while B's earlier marker was still open", err)
				default:
				}
				release()
				if err := <-bErr; err != nil {
					t.Fatalf("B: Commit: %v", err)
				}
				zErr = <-zDone
			case tc.otherCrashes:
				b.hook = func(p sessPoint) bool { return p == sessAfterMarker }
				if err := b.Commit(ctx); !errors.Is(err, errSessCrashed) {
					t.Fatalf("B: Commit: %v, want the crash", err)
				}
				zErr = z.Commit(ctx)
				if st := sessTxnState(t, env, "zombie-b"); st == "Ongoing" {
					t.Errorf("B's stale transaction is still open after Z's commit")
				}
			default:
				if err := b.Commit(ctx); err != nil {
					t.Fatalf("B: Commit: %v", err)
				}
				zErr = z.Commit(ctx)
			}

			winner := "zombie-b"
			if tc.wantZombieErr {
				var ce *ConflictError
				if !errors.Is(zErr, ErrConflict) || !errors.Is(zErr, ErrAborted) || !errors.As(zErr, &ce) {
					t.Fatalf("Z: Commit: %v, want a *ConflictError (ErrConflict, ErrAborted)", zErr)
				}
				if ce.Lapsed != tc.wantLapsed {
					t.Errorf("Z: conflict Lapsed = %v, want %v (%v)", ce.Lapsed, tc.wantLapsed, ce)
				}
				if !tc.wantLapsed && (ce.Earlier.Status != acklog.Committed || ce.Earlier.Marker.TransactionalID != "zombie-b" || ce.Unresolved) {
					t.Errorf("Z: conflict with %+v (unresolved %v), want B's committed marker", ce.Earlier, ce.Unresolved)
				}
			} else {
				if zErr != nil {
					t.Fatalf("Z: Commit: %v, want success once B's stale transaction is aborted", zErr)
				}
				winner = "zombie-z"
			}

			// Drain what is left with a fresh session; records already
			// processed must never be handed out again.
			c := sessOpen(t, env, group, "in", "zombie-c")
			l := newSessLedger()
			l.committed(zr)
			if winner == "zombie-b" {
				l.committed(br)
			}
			if err := sessMirror(ctx, c, "out", n, l); err != nil {
				t.Fatal(err)
			}
			pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			more, err := c.Poll(pctx)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("final Poll: %d records, %v; want none", len(more), err)
			}
			for _, r := range zr {
				if _, ok := l.max[sessID(r)]; ok {
					t.Errorf("record %s, processed by the winner, was handed out again", sessID(r))
				}
			}
			from := sessCheckOutputs(t, env, "out", n)
			for _, r := range zr {
				if s := from[string(r.Key)]; s != winner {
					t.Errorf("output of %s written by %q, want %s", r.Key, s, winner)
				}
			}
			sessAssertAllAcked(t, env, group, "in")
		})
	}
}

// sessAwaitAckLogEnd waits until the ack-log holds at least n records.
func sessAwaitAckLogEnd(t *testing.T, ctx context.Context, env *kafkatest.Env, topic string, n int64) {
	t.Helper()
	adm := env.Admin(t)
	for {
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err != nil {
			t.Fatalf("ListEndOffsets(%s): %v", topic, err)
		}
		if e, ok := ends.Lookup(topic, 0); ok && e.Offset >= n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("ack-log %s never reached %d records", topic, n)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
