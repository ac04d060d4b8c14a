package sharegroup

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// deliveryLog counts, record by record, the deliveries the broker made to
// the source's lanes (the lanes' test hook sees every batch a poll
// returns). The broker counts a delivery at every acquisition, so a record
// acquired at delivery count n was delivered n times in all, whether the
// lanes saw each delivery or not (a fetch cut off by Close is released
// unseen): the log checks that no attempt cost a record more than one
// delivery, seen or unseen.
type deliveryLog struct {
	mu       sync.Mutex
	attempt  int
	last     map[string]seenAt         // record -> its last delivery seen
	now      map[string]int            // record -> deliveries seen in this attempt
	by       map[string]map[string]int // lane prefix ("src#0") -> records seen this attempt
	overrun  []string                  // records that some attempts cost more than a delivery each
	unseen   int                       // deliveries seen by no lane
	most     map[string]int32          // topic -> highest delivery count of one of its records
	perCount map[int32]int             // delivery count -> acquisitions seen at it
	hist     map[string][]string       // record -> each acquisition seen: lane, count, time, lock left
}

// seenAt is a delivery seen: its count and attempt.
type seenAt struct {
	count   int32
	attempt int
}

func newDeliveryLog() *deliveryLog {
	return &deliveryLog{attempt: 1, last: map[string]seenAt{}, now: map[string]int{}, by: map[string]map[string]int{},
		most: map[string]int32{}, perCount: map[int32]int{}, hist: map[string][]string{}}
}

func (d *deliveryLog) opt() Opt { return withCfg(func(c *cfg) { c.testAcquired = d.acquired }) }

func (d *deliveryLog) acquired(lane string, recs []*kgo.Record) {
	d.mu.Lock()
	defer d.mu.Unlock()
	sub, _, _ := strings.Cut(lane, "/")
	if d.by[sub] == nil {
		d.by[sub] = map[string]int{}
	}
	now := time.Now()
	for _, r := range recs {
		k := fmt.Sprintf("%s/%d@%d", r.Topic, r.Partition, r.Offset)
		d.hist[k] = append(d.hist[k], fmt.Sprintf("%s#%d at %s (lock left %v)", lane, r.DeliveryCount(),
			now.Format("15:04:05.000"), r.AcquisitionDeadline().Sub(now).Round(time.Millisecond)))
		prev, dc := d.last[k], r.DeliveryCount()
		if dc-prev.count > int32(d.attempt-prev.attempt) {
			d.overrun = append(d.overrun, fmt.Sprintf("%s: delivery %d in attempt %d (%s), after delivery %d in attempt %d",
				k, dc, d.attempt, lane, prev.count, prev.attempt))
		}
		d.unseen += int(dc - prev.count - 1)
		d.last[k] = seenAt{dc, d.attempt}
		d.now[k]++
		d.by[sub][k]++
		d.most[r.Topic] = max(d.most[r.Topic], dc)
		d.perCount[dc]++
	}
}

// redelivered returns the acquisitions of up to n records delivered more
// than once, for a failure's message. d.mu is held.
func (d *deliveryLog) redelivered(n int) []string {
	var out []string
	for k, h := range d.hist {
		if len(h) > 1 && len(out) < n {
			out = append(out, k+": "+strings.Join(h, ", "))
		}
	}
	slices.Sort(out)
	return out
}

// subtasksSeen is how many lane prefixes acquired something this attempt.
func (d *deliveryLog) subtasksSeen() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.by)
}

// endAttempt returns the most deliveries of one record seen in the attempt
// and how many records were delivered in it, and starts the next attempt.
func (d *deliveryLog) endAttempt() (most, delivered int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, n := range d.now {
		most = max(most, n)
	}
	delivered = len(d.now)
	clear(d.now)
	clear(d.by)
	d.attempt++
	return most, delivered
}

// attemptKind is how a failed attempt of TestQuickRestartsBurnOneDelivery
// ends.
type attemptKind string

const (
	// failEarly: the lanes start and acquire, and the task fails before the
	// source admitted (emitted) anything.
	failEarly attemptKind = "fails before admitting"
	// failHolding: the source emits for 2 s (or until it emitted every
	// record) and holds what it emitted; no checkpoint.
	failHolding attemptKind = "fails holding"
	// failPrecommitted: as failHolding, then checkpoint 1 pre-commits its
	// markers; it never completes.
	failPrecommitted attemptKind = "fails pre-committed"
)

// Issue 9, case 4, restarts: with Kafka's default delivery limit (5) and
// the default lanes (8 partitions, parallelism 2: 4 lanes per subtask, all
// made by one factory, as a job's deployment makes them), renewals on, 7
// attempts in a row fail quickly: right after start while the lanes
// acquire, before the source admitted anything (5 of them, 3 in a row at
// the end), or holding what they emitted, once with checkpoint 1
// pre-committed; then subtask 1 still polls while subtask 0 closes (the
// task that failed closes first). The 8th attempt runs checkpoints until
// the input and the retry topic are drained.
//
// Every input offset and every retry-topic copy must be in exactly one
// committed marker, every value emitted exactly once by the last attempt,
// nothing dead-lettered, no ErrRecordsSkipped; and the churn bound: no
// attempt costs a record more than one delivery, seen by a lane or not.
func TestQuickRestartsBurnOneDeliveryPerAttemptAndLoseNothing(t *testing.T) {
	const parts, perPart, total = 8, 40, 8 * 40
	env := kafkatest.New(t, append(lockBroker(3*time.Second), broker.Config("group.share.delivery.count.limit", "5"))...)
	env.CreateTopic(t, "in", parts, nil)
	for p := range int32(parts) {
		produceTo(t, env, "in", p, int(p)*perPart, int(p+1)*perPart)
	}
	dl := newDeliveryLog()
	newSrc := testSources(t, env, Lanes(0), MarkerGrace(time.Hour), dl.opt())
	open := func(attempt int) []*Source[string] {
		t.Helper()
		var srcs []*Source[string]
		for sub := range 2 {
			s, err := openFrom(t, newSrc, sub, attempt, nil)
			if err != nil {
				t.Fatalf("attempt %d: Open subtask %d: %v", attempt, sub, err)
			}
			srcs = append(srcs, s)
		}
		return srcs
	}
	kinds := []attemptKind{failHolding, failEarly, failEarly, failPrecommitted, failEarly, failEarly, failEarly}
	for i, kind := range kinds {
		attempt := i + 1
		srcs := open(attempt)
		switch kind {
		case failEarly:
			for _, s := range srcs {
				if err := s.startLanes(); err != nil { // what the first Poll does
					t.Fatal(err)
				}
			}
			for deadline := time.Now().Add(10 * time.Second); dl.subtasksSeen() < 2 && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
		case failHolding, failPrecommitted:
			c := &sliceCollector{}
			for end := time.Now().Add(2 * time.Second); time.Now().Before(end) && len(c.vals) < total; {
				for _, s := range srcs {
					if err := s.Poll(t.Context(), c); err != nil {
						t.Fatalf("attempt %d: Poll: %v", attempt, err)
					}
				}
			}
			if kind == failPrecommitted {
				for _, s := range srcs {
					if _, err := s.Snapshot(t.Context(), 1); err != nil {
						t.Fatalf("attempt %d: Snapshot(1): %v", attempt, err)
					}
				}
			}
		}
		// Subtask 0 fails and closes; unless the attempt failed before
		// admitting anything, subtask 1 polls on until it is cancelled too.
		closeSubtasks(t, srcs, kind != failEarly)
		most, delivered := dl.endAttempt()
		t.Logf("attempt %d (%s): %d records delivered, at most %d times each", attempt, kind, delivered, most)
	}

	srcs := open(len(kinds) + 1)
	vals := drainSubtasks(t, env, srcs, parts, perPart, 40*time.Second)
	if _, err := srcs[0].checkStarts(t.Context()); err != nil {
		t.Errorf("share start offset check after the last attempt: %v", err)
	}
	if d := exactlyOnce(counts(t, vals), total); d != "" {
		t.Errorf("the last attempt emitted: %s", d)
	}
	checkCoveredOnce(t, env, parts, perPart)
	if dlq := env.ReadCommitted(t, "g-dlq"); len(dlq) != 0 {
		t.Errorf("%d records dead-lettered, want none", len(dlq))
	}
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if len(dl.overrun) > 0 {
		t.Errorf("%d times a record cost more than one delivery per attempt (a failed attempt may cost a record one "+
			"delivery, its own): %v", len(dl.overrun), dl.overrun[:min(len(dl.overrun), 10)])
	}
	rq := map[int]int{}
	for _, r := range env.ReadCommitted(t, "g-retry") {
		rq[requeues(r)]++
	}
	t.Logf("highest delivery count per topic: %v; acquisitions by delivery count: %v; deliveries no lane saw: %d; "+
		"retry-topic copies by re-queue count: %v", dl.most, dl.perCount, dl.unseen, rq)
}

// Issue 9, case 4: an attempt that fails before it admitted anything
// (the lane acquired its batch, the source never emitted it) still cost
// each record a delivery. With Kafka's default limit (5) and one lane, 6
// such attempts in a row acquire the same 10 records 6 times: unless
// Close re-queues the records at the end of their budget, the 5th
// attempt's release archives them. The 7th attempt must emit and commit
// every record once, nothing dead-lettered, no ErrRecordsSkipped.
func TestAttemptsFailingBeforeAdmittingReQueueAtCloseInsteadOfArchiving(t *testing.T) {
	env := kafkatest.New(t, append(lockBroker(3*time.Second), broker.Config("group.share.delivery.count.limit", "5"))...)
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", 10)
	dl := newDeliveryLog()
	newSrc := testSources(t, env, MarkerGrace(time.Hour), dl.opt())
	for attempt := 1; attempt <= 6; attempt++ {
		s, err := openFrom(t, newSrc, 0, attempt, nil)
		if err != nil {
			t.Fatalf("attempt %d: Open: %v", attempt, err)
		}
		if err := s.startLanes(); err != nil { // what the first Poll does
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); dl.subtasksSeen() < 1 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		s.Close()
		_, delivered := dl.endAttempt()
		t.Logf("attempt %d: %d records delivered, none admitted", attempt, delivered)
	}
	s, err := openFrom(t, newSrc, 0, 7, nil)
	if err != nil {
		t.Fatalf("attempt 7: Open: %v", err)
	}
	vals := drainOneLane(t, env, s, 10)
	checkEveryRecordOnce(t, env, vals, 10, "the 7th attempt")
	if _, err := s.checkStarts(t.Context()); err != nil {
		t.Errorf("share start offset check after the last attempt: %v", err)
	}
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if len(dl.overrun) > 0 {
		t.Errorf("%d times a record cost more than one delivery per attempt: %v", len(dl.overrun), dl.overrun[:min(len(dl.overrun), 10)])
	}
	t.Logf("acquisitions by delivery count: %v; retry-topic copies: %d", dl.perCount, len(env.ReadCommitted(t, "g-retry")))
}

// drainOneLane runs checkpoints 1, 2, ... on s until the share start
// offsets of in[0] (n records) and of the retry topic are at their ends,
// and returns the values emitted.
func drainOneLane(t *testing.T, env *kafkatest.Env, s *Source[string], n int64) []string {
	t.Helper()
	vals, id := runCheckpoints(t, env, s, "g", in0, n, 1, 20*time.Second)
	// The originals are all acknowledged once the input's share start is
	// at n; the copies re-queued to the retry topic are emitted once its
	// share start reaches its end too.
	retry := acklog.TopicPartition{Topic: "g-retry"}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		ends, err := env.Admin(t).ListEndOffsets(t.Context(), retry.Topic)
		if err != nil {
			t.Fatal(err)
		}
		end, _ := ends.Lookup(retry.Topic, 0)
		if shareStart(t, env, "g", retry) >= end.Offset {
			break
		}
		var more []string
		more, id = runCheckpoints(t, env, s, "g", retry, end.Offset, id, time.Until(deadline))
		vals = append(vals, more...)
	}
	return vals
}

// closeSubtasks closes subtask 0, then subtask 1; with polling, subtask 1
// polls while subtask 0 closes, as the task that failed first closes while
// the others still run.
func closeSubtasks(t *testing.T, srcs []*Source[string], polling bool) {
	t.Helper()
	stop := make(chan struct{})
	polled := make(chan error, 1)
	go func() {
		c := &sliceCollector{}
		for polling {
			select {
			case <-stop:
				polled <- nil
				return
			default:
			}
			if err := srcs[1].Poll(t.Context(), c); err != nil {
				polled <- err
				return
			}
		}
		polled <- nil
	}()
	srcs[0].Close()
	close(stop)
	if err := <-polled; err != nil {
		t.Fatalf("subtask 1 Poll while subtask 0 closed: %v", err)
	}
	srcs[1].Close()
}

// drainSubtasks runs checkpoints 1, 2, ... on srcs (poll a while, Snapshot,
// NotifyCheckpointComplete) until the share start offsets of every input
// partition (parts of perPart records) and of the retry topic are at their
// ends, within the given time, and returns the values emitted.
func drainSubtasks(t *testing.T, env *kafkatest.Env, srcs []*Source[string], parts int32, perPart int, within time.Duration) []string {
	t.Helper()
	c := &sliceCollector{}
	adm := env.Admin(t)
	done := func() bool {
		ends, err := adm.ListEndOffsets(t.Context(), "g-retry")
		if err != nil {
			t.Fatal(err)
		}
		if end, _ := ends.Lookup("g-retry", 0); shareStart(t, env, "g", acklog.TopicPartition{Topic: "g-retry"}) < end.Offset {
			return false
		}
		for p := range parts {
			if shareStart(t, env, "g", acklog.TopicPartition{Topic: "in", Partition: p}) < int64(perPart) {
				return false
			}
		}
		return true
	}
	id := checkpoint.ID(1)
	for deadline := time.Now().Add(within); !done() && time.Now().Before(deadline); id++ {
		for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
			for _, s := range srcs {
				if err := s.Poll(t.Context(), c); err != nil {
					t.Fatalf("Poll: %v", err)
				}
			}
		}
		for _, s := range srcs {
			if _, err := s.Snapshot(t.Context(), id); err != nil {
				t.Fatalf("Snapshot(%d): %v", id, err)
			}
		}
		for _, s := range srcs {
			if err := s.NotifyCheckpointComplete(t.Context(), id); err != nil {
				t.Fatalf("NotifyCheckpointComplete(%d): %v", id, err)
			}
		}
	}
	return c.vals
}

// checkCoveredOnce checks that every offset of the input (parts partitions
// of perPart records) and every committed record of the retry topic is in
// exactly one committed ack marker.
func checkCoveredOnce(t *testing.T, env *kafkatest.Env, parts int32, perPart int) {
	t.Helper()
	entries := ackLogEntries(t, env, "g")
	for p := range parts {
		tp := acklog.TopicPartition{Topic: "in", Partition: p}
		cover := committedCover(entries, tp)
		for off := range perPart {
			if cover[off] != 1 {
				t.Errorf("%s offset %d: in %d committed markers, want 1 (share start %d)", tp, off, cover[off],
					shareStart(t, env, "g", tp))
			}
		}
	}
	retry := acklog.TopicPartition{Topic: "g-retry"}
	cover := committedCover(entries, retry)
	copies := env.ReadCommitted(t, retry.Topic)
	for _, r := range copies {
		if n := cover[int(r.Offset)]; n != 1 {
			t.Errorf("%s offset %d (a copy of %s): in %d committed markers, want 1", retry, r.Offset, r.Value, n)
		}
	}
}

// The chaos suite's finding (issue 29): a data-plane partition failed a
// job's attempts within 40-100 ms of their start, six times in 22 s with
// the default restart strategy, and the job failed for good with
// ErrRecordsSkipped. Each attempt's lane had its first share fetch at the
// broker when the attempt failed: the broker acquired the batch (a
// delivery) after the source stopped polling, the client released it
// unseen at Close, and no lane ever saw the records' delivery counts climb,
// so none was re-queued before the broker archived them.
//
// Here each of 6 attempts closes while its lane's fetch is held at the
// broker, which answers it only once Close has stopped the lane's poller.
// With Kafka's default limit (5) the records must be re-queued before
// that, never archived: the 7th attempt emits and commits every record
// once, nothing dead-lettered, no ErrRecordsSkipped.
func TestAttemptsClosedWithAFetchInFlightReQueueInsteadOfArchiving(t *testing.T) {
	env := kafkatest.New(t, append(lockBroker(3*time.Second), broker.Config("group.share.delivery.count.limit", "5"))...)
	env.CreateTopic(t, "in", 1, nil)
	produceN(t, env, "in", 10)
	dl := newDeliveryLog()
	newSrc := testSources(t, env, MarkerGrace(time.Hour), dl.opt())
	c := env.Broker.Cluster()
	for attempt := 1; attempt <= 6; attempt++ {
		s, err := openFrom(t, newSrc, 0, attempt, nil)
		if err != nil {
			t.Fatalf("attempt %d: Open: %v", attempt, err)
		}
		// The broker holds the attempt's first share fetch until
		// release is closed.
		held, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		c.ControlKey(shareFetchKey, func(kmsg.Request) (kmsg.Response, error, bool) {
			first := false
			once.Do(func() { first = true })
			if first {
				close(held)
				c.SleepControl(func() { <-release })
			}
			return nil, nil, false
		})
		if err := s.startLanes(); err != nil { // what the first Poll does
			t.Fatal(err)
		}
		select {
		case <-held:
		case <-time.After(30 * time.Second):
			t.Fatalf("attempt %d: no share fetch reached the broker", attempt)
		}
		closed := make(chan struct{})
		go func() {
			defer close(closed)
			s.Close()
		}()
		// The attempt fails: the source stops polling, and only then
		// does the broker answer the fetch.
		for stopped := false; !stopped; {
			s.life.Lock()
			stopped = s.fetchStopped
			s.life.Unlock()
			time.Sleep(time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond)
		close(release)
		<-closed
		_, delivered := dl.endAttempt()
		t.Logf("attempt %d: %d records delivered to a lane, none admitted", attempt, delivered)
	}
	s, err := openFrom(t, newSrc, 0, 7, nil)
	if err != nil {
		t.Fatalf("attempt 7: Open: %v", err)
	}
	vals := drainOneLane(t, env, s, 10)
	checkEveryRecordOnce(t, env, vals, 10, "the 7th attempt")
	if _, err := s.checkStarts(t.Context()); err != nil {
		t.Errorf("share start offset check after the last attempt: %v", err)
	}
	t.Logf("acquisitions seen by delivery count: %v; retry-topic copies: %d", dl.perCount, len(env.ReadCommitted(t, "g-retry")))
}
