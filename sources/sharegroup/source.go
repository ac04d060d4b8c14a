package sharegroup

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/deadletter"
	"github.com/weirstream/weir/internal/kafkatxn"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// Failpoints of the source (docs/architecture.md, "Failpoints").
const (
	FailpointAfterAckPrecommit = "source.after-ack-precommit"
	FailpointAfterAckCommit    = "source.after-ack-commit"
)

// Dead-letter headers (internal/deadletter, shared with the partition
// source).
const (
	HeaderError         = deadletter.HeaderError
	HeaderDeliveryCount = deadletter.HeaderDeliveryCount
	HeaderTopic         = deadletter.HeaderTopic
	HeaderPartition     = deadletter.HeaderPartition
	HeaderOffset        = deadletter.HeaderOffset
)

// New returns a source factory reading a share group and decoding each
// record with decode. Options are validated here, so a bad job is refused
// when it is built.
func New[T any](decode func(*kgo.Record) (T, error), opts ...Opt) (func() runtime.Source[T], error) {
	c := sourceDefaults()
	for _, o := range opts {
		o.apply(&c)
	}
	if err := c.validateSource(); err != nil {
		return nil, err
	}
	if decode == nil {
		return nil, fmt.Errorf("%w: no decode function", ErrInvalidConfig)
	}
	if c.ackLogTopic == "" {
		c.ackLogTopic = acklog.TopicFor(c.group)
	}
	if c.dlqTopic == "" {
		c.dlqTopic = c.group + "-dlq"
	}
	if c.requeueTopic == "" {
		c.requeueTopic = c.group + "-retry"
	}
	sib := newSiblings[T]()
	return func() runtime.Source[T] { return &Source[T]{cfg: c, decode: decode, sib: sib} }, nil
}

// Source is one subtask of a share-group source. Build it with New.
type Source[T any] struct {
	cfg    cfg
	decode func(*kgo.Record) (T, error)
	oc     *runtime.OperatorContext
	log    *zap.Logger

	admin  *kgo.Client
	txn    *kafkatxn.TxnWriter // ack markers and dead letters (transactional); dead letters otherwise
	ix     *acklog.Index
	prefix string // of this operator's transactional ids: markers with it are this job's

	lanes     []*lane // set once in Open, under life
	laneOpts  []kgo.Opt
	ready     chan *lane
	limit     int // the broker's group.share.partition.max.record.locks
	lastGC    time.Time
	lastCheck time.Time

	pendingMu sync.Mutex
	pending   map[acklog.TopicPartition]int64 // subtask 0's last measure of the backlog (pendingRecords)
	stopped   bool
	closed    bool
	member    string
	// lastAdmitted is when Poll last admitted a batch (CommitWhenIdle).
	lastAdmitted time.Time

	// Start and stop. Siblings stop this subtask's fetching from their
	// own goroutines (stopFetching), so life guards what they share.
	sib          *siblings[T]
	sibKey       siblingKey
	life         sync.Mutex
	started      bool               // the renew loop runs, lanes start one by one
	fetchStopped bool               // no lane polls again
	nextLane     int                // lanes[:nextLane] were started
	lastStart    time.Time          // of lanes[nextLane-1]
	cancel       context.CancelFunc // the renew loop's and the pollers'
	bgCtx        context.Context    // cancel's: what the lanes' goroutines finish epochs with
	pollCtx      context.Context
	pollCancel   context.CancelFunc
	stopFetch    sync.Once
	wg           sync.WaitGroup // the renew loop
	pollers      sync.WaitGroup
	paused       atomic.Bool // renewals stopped (tests play a paused process)
	fatal        chan error  // a background check found an unrecoverable loss
	rq           requeueWriter
	requeueAt    int32 // delivery count from which a record is re-queued
	stale        map[int64]bool
	counters     sourceCounters
	// completed is the latest checkpoint whose ack markers this subtask
	// committed: the lanes' goroutines ACCEPT the epochs it covers.
	completed checkpoint.Latest
	// The group's frontier (watermark.go): the loop's latest reading
	// (fversion, fsplits, under fmu) and the partitions ahead that lanes
	// pause (ahead, under fmu); fdecoded and fcache are the task
	// goroutine's decoded copy of reading fdecoded.
	fmu           sync.Mutex
	fversion      int64
	fsplits       []runtime.Frontier[*kgo.Record]
	ahead         map[string][]int32
	fdecoded      int64
	fcache        []runtime.Frontier[T]
	startFrontier sync.Once
	frontierCtx   context.Context
	stopFrontier  context.CancelFunc
	fwg           sync.WaitGroup // the frontier loop
	// below is the lineage position (lineage.go), task goroutine only.
	below int64
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]`)

// Open implements runtime.Source: checks the broker, prepares topics and the
// group, and in transactional mode finishes the restored checkpoint's marker
// transactions (commit) and aborts lingering ones before anything is polled.
// Subtask 0 then checks that the group's share start offsets never skipped
// a record no committed marker covers.
func (s *Source[T]) Open(ctx context.Context, oc *runtime.OperatorContext) error {
	s.oc = oc
	s.log = s.cfg.logger
	if s.log == nil {
		s.log = oc.Logger
	}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	s.paused.Store(s.cfg.paused)
	s.fatal = make(chan error, 1)
	s.stale = map[int64]bool{}
	s.member = fmt.Sprintf("%s#%d", oc.UID, oc.Subtask)
	s.sibKey = siblingKey{job: oc.Job, uid: oc.UID, attempt: oc.Attempt}
	if s.sib != nil {
		s.sib.join(s.sibKey, s)
	}
	base := append([]kgo.Opt{kgo.SeedBrokers(s.cfg.brokers...)}, s.cfg.clientOpts...)
	var err error
	if s.admin, err = kgo.NewClient(base...); err != nil {
		return fmt.Errorf("%w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := checkShareAPIs(sctx, s.admin, s.log); err != nil {
		return err
	}
	partitions, err := s.partitions(sctx)
	if err != nil {
		return err
	}
	adm := kadm.NewClient(s.admin)
	s.limit = brokerIntConfig(sctx, adm, "group.share.partition.max.record.locks", 2000)
	s.frontierCtx, s.stopFrontier = context.WithCancel(context.Background())
	limit := brokerIntConfig(sctx, adm, "group.share.delivery.count.limit", 5)
	// Without transactions a record with at most one delivery left is
	// dead-lettered (MaxDeliveries) before the broker archives it. With
	// them, a record is re-queued with restartBurn deliveries left: a
	// failed attempt costs one, and one more may pass unseen.
	s.requeueAt = int32(max(2, limit-restartBurn))
	if s.cfg.maxDeliveries == 0 {
		s.cfg.maxDeliveries = int32(max(2, limit-1))
	}
	if err := ensureTopic(sctx, adm, s.cfg.dlqTopic, 1); err != nil {
		return err
	}
	if err := prepareGroup(sctx, s.admin, s.cfg.group, s.cfg.resetEarliest); err != nil {
		if errors.Is(err, ErrReadUncommitted) {
			return runtime.Unrecoverable(err)
		}
		return err
	}
	s.prefix = s.cfg.txnPrefix
	if s.prefix == "" {
		s.prefix = unsafeChars.ReplaceAllString("weir-"+oc.Job+"-"+oc.UID, "_")
		if strings.HasSuffix(s.prefix, requeuePrefixSuffix) {
			s.prefix += "_" // never another source's re-queue prefix
		}
	}
	wopts := []kafkatxn.Opt{kafkatxn.Brokers(s.cfg.brokers...), kafkatxn.TransactionalIDPrefix(s.prefix),
		kafkatxn.Subtask(oc.Subtask, oc.Parallelism), kafkatxn.TransactionTimeout(s.cfg.txnTimeout),
		kafkatxn.ClientOpts(s.cfg.clientOpts...), kafkatxn.Logger(s.log)}
	if s.cfg.mode == Transactional {
		if err := acklog.EnsureTopic(sctx, adm, s.cfg.ackLogTopic); err != nil {
			return fmt.Errorf("ack-log: %w", err)
		}
		if oc.Subtask == 0 {
			warnShortDeleteRetention(sctx, s.log, adm, s.cfg.ackLogTopic)
		}
		if err := ensureTopic(sctx, adm, s.cfg.requeueTopic, 1); err != nil {
			return err
		}
		wopts = append(wopts, kafkatxn.Guarantee(kafkatxn.ExactlyOnce))
	} else {
		wopts = append(wopts, kafkatxn.Guarantee(kafkatxn.AtLeastOnce))
	}
	if s.txn, err = kafkatxn.NewTxnWriter(ctx, wopts...); err != nil {
		return fmt.Errorf("%w", err)
	}
	if s.cfg.mode == Transactional {
		// A marker transaction must outlive the job's worst checkpoint
		// timing, or a completed checkpoint's acknowledgements are lost.
		err := kafkatxn.CheckTransactionTimeout(sctx, s.txn.Admin(), s.cfg.txnTimeout, oc.Checkpointing)
		switch {
		case errors.Is(err, kafkatxn.ErrInvalidConfig):
			return runtime.Unrecoverable(fmt.Errorf("ack-marker transactions: %w", err))
		case err != nil:
			s.log.Warn("cannot read the brokers' transaction.max.timeout.ms; not checked", zap.Error(err))
		}
	}
	// Commit the restored checkpoint's marker transactions and abort
	// anything later, before any lane polls: a redelivery must find the
	// recovered markers committed. (Without transactions this only readies
	// the dead-letter writer.)
	if err := s.txn.Recover(ctx, oc.CommitHandles); err != nil {
		err = fmt.Errorf("recover ack-marker transactions: %w", err)
		if errors.Is(err, kafkatxn.ErrTxnLost) {
			// A completed checkpoint's acknowledgements are lost (the
			// broker aborted their transaction, or the ack-log lost its
			// partition, ErrTxnTopicGone): every restart would find the
			// same, and the records they cover would be processed again.
			return runtime.Unrecoverable(err)
		}
		return err
	}
	if s.cfg.mode == Transactional {
		rqOpts := append(slices.Clone(wopts), kafkatxn.TransactionalIDPrefix(s.prefix+requeuePrefixSuffix))
		if s.rq.w, err = kafkatxn.NewTxnWriter(ctx, rqOpts...); err != nil {
			return fmt.Errorf("%w", err)
		}
		// Abort a re-queue transaction a crash left open: its originals
		// come back and are judged again.
		if err := s.rq.w.Recover(ctx, nil); err != nil {
			return fmt.Errorf("recover re-queue transactions: %w", err)
		}
		if s.ix, err = acklog.NewIndex(ctx, s.cfg.brokers, s.cfg.ackLogTopic, s.cfg.clientOpts...); err != nil {
			return fmt.Errorf("ack-log index: %w", err)
		}
		// The lineage position starts at the ack-log's end: the restore
		// was verified (runtime.RestoreVerifier) or is a failover, and a
		// new job's state owes nothing to the group's past.
		below, _, err := restoredBelow(oc.Restored, oc.CommitHandles, s.cfg.ackLogTopic)
		if err != nil {
			return runtime.Unrecoverable(fmt.Errorf("checkpoint %d: %w", oc.RestoredFrom, err))
		}
		if err := s.ix.CatchUpToEnd(sctx); err != nil {
			return fmt.Errorf("ack-log: %w", err)
		}
		s.below = max(below, s.ix.Position())
		if oc.Subtask == 0 {
			if _, err := s.checkStarts(sctx); err != nil {
				return err
			}
		}
	}
	if s.cfg.batch == 0 {
		s.cfg.batch = min(s.limit, 10000)
	}
	n := s.cfg.lanes
	if n == 0 {
		n = max(1, min(8, partitions/max(1, oc.Parallelism)))
	}
	s.ready = make(chan *lane, n)
	s.laneOpts = append(base, kgo.ShareGroup(s.cfg.group), kgo.ConsumeTopics(s.inputs()...),
		kgo.ShareMaxRecords(int32(s.cfg.batch)), kgo.ShareMaxRecordsStrict(), kgo.FetchMaxWait(laneFetchWait),
		kgo.ConnIdleTimeout(10*time.Minute))
	lanes := make([]*lane, n)
	for i := range lanes {
		lanes[i] = newLane(i, fmt.Sprintf("%s/lane%d", s.member, i))
	}
	// A lane's client joins the share group when the lane starts; the
	// first one is made here, so that a bad option fails Open.
	if err := s.newLaneClient(lanes[0]); err != nil {
		return err
	}
	s.life.Lock()
	s.lanes = lanes
	s.life.Unlock()
	s.registerMetrics(oc.Metrics())
	s.log.Info("share-group source open", zap.String("group", s.cfg.group), zap.Strings("topics", s.cfg.topics),
		zap.Stringer("mode", s.cfg.mode), zap.Int("lanes", n), zap.Int("batch", s.cfg.batch),
		zap.Int("restored_handles", len(oc.CommitHandles)))
	return nil
}

// newLaneClient makes lane l's share-consumer client.
func (s *Source[T]) newLaneClient(l *lane) error {
	cl, err := kgo.NewClient(append(slices.Clone(s.laneOpts), kgo.ShareAckCallback(l.ack.callback), kgo.ClientID(l.name),
		kgo.WithHooks(&l.fetches, &l.unpolled))...)
	if err != nil {
		return fmt.Errorf("lane %d: %w", l.id, err)
	}
	l.cl, l.ack.cl = cl, cl
	return nil
}

// startLanes starts the renew loop and the first lane at the first call,
// then one more lane per call once the last one started has had a batch
// admitted, or has found nothing for cfg.stagger. Lanes start one by one
// so that an attempt that fails right after it started has acquired one
// lane's batch, not one per lane: every acquisition costs a delivery
// (docs/architecture.md, "Delivery budget"). Nothing starts once the
// source stopped fetching.
func (s *Source[T]) startLanes() error {
	s.life.Lock()
	defer s.life.Unlock()
	if s.fetchStopped || s.nextLane >= len(s.lanes) {
		return nil
	}
	if !s.started {
		s.started = true
		ctx, cancel := context.WithCancel(context.Background())
		s.cancel, s.bgCtx = cancel, ctx
		s.pollCtx, s.pollCancel = context.WithCancel(ctx)
		s.wg.Add(2)
		go func() {
			defer s.wg.Done()
			s.renewLoop(ctx)
		}()
		go func() {
			defer s.wg.Done()
			s.resolveLoop(ctx)
		}()
		return s.startLaneLocked()
	}
	last := s.lanes[s.nextLane-1]
	last.mu.Lock()
	admitted := last.admitted
	last.mu.Unlock()
	if !admitted && time.Since(s.lastStart) < s.cfg.stagger {
		return nil
	}
	return s.startLaneLocked()
}

// startLaneLocked starts lanes[nextLane]'s poller. s.life is held.
func (s *Source[T]) startLaneLocked() error {
	l := s.lanes[s.nextLane]
	if l.cl == nil {
		if err := s.newLaneClient(l); err != nil {
			return err
		}
	}
	s.nextLane++
	s.lastStart = time.Now()
	s.pollers.Add(1)
	go func() {
		defer s.pollers.Done()
		s.runLane(s.pollCtx, s.bgCtx, l)
	}()
	return nil
}

// runLane is lane l's goroutine, until ctx ends: whenever the lane is idle
// it polls, and hands the batch to the task goroutine (ready), which
// admits it; then it waits, and finishes (ACCEPTs, polls again) the epoch
// once a completed checkpoint covers it, so that the task goroutine never
// waits for a lane's acknowledgement round trip and each lane cycles on
// its own. fctx (not ctx: the source stops fetching before it releases
// anything) bounds the finishing.
func (s *Source[T]) runLane(ctx, fctx context.Context, l *lane) {
	for {
		if !l.acquire(ctx, s.cfg.batch, func() { s.alignLane(l) }, s.cfg.testAcquired) {
			return
		}
		select {
		case s.ready <- l:
		case <-ctx.Done():
			return
		}
		for {
			done := s.completed.Load()
			l.mu.Lock()
			idle, due := l.state == laneIdle, completedBy(done)(l)
			l.mu.Unlock()
			if due {
				s.finishLane(fctx, l, done, s.asideOutcome(fctx))
				continue
			}
			if idle {
				break
			}
			select {
			case <-l.wake:
			case <-ctx.Done():
				return
			}
		}
	}
}

// stopFetching stops every lane's poller, pauses every lane's client (a
// fetch it sends from then on acquires nothing), closes the clients of
// idle lanes (each waits for its fetch in flight, then leaves the group;
// idle lanes hold nothing) and waits until no other lane has a fetch in
// flight (see inFlight), so that no lane of this subtask acquires records any more: in
// particular none that its siblings are about to release. Lanes that hold
// records keep them, renewed, until Close. Idempotent; siblings call it
// from their goroutines.
func (s *Source[T]) stopFetching() {
	s.stopFetch.Do(func() {
		s.life.Lock()
		s.fetchStopped = true
		cancel, lanes := s.pollCancel, s.lanes
		s.life.Unlock()
		if cancel != nil {
			cancel()
		}
		s.pollers.Wait()
		var wg sync.WaitGroup
		for _, l := range lanes {
			l.mu.Lock()
			idle := l.state == laneIdle
			l.mu.Unlock()
			if l.cl == nil {
				continue // never started
			}
			// A fetch the client builds from now on forgets every
			// partition and acquires nothing. Partitions paused for
			// alignment are resumed (their topics stay paused), so
			// that takeUnpolled's polls return what the client
			// buffered of them instead of releasing it unseen.
			l.cl.PauseFetchTopics(s.inputs()...)
			if len(l.paused) > 0 {
				l.cl.ResumeFetchPartitions(l.paused)
				l.paused = nil
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				// kgo bounds a fetch's round trip by its wait + 5s.
				ctx, cancel := context.WithTimeout(context.Background(), laneFetchWait+5*time.Second)
				defer cancel()
				if idle {
					// A fetch answered after the poller stopped
					// acquired records no poll returned: the lane
					// takes them for Close to judge.
					if !l.takeUnpolled(ctx, s.inputs(), s.cfg.testAcquired) {
						l.close()
					}
					return
				}
				l.fetches.wait(ctx)
			}()
		}
		wg.Wait()
	})
}

// setPaused stops (true) or resumes the renewal of held locks: tests use it
// to play a process that pauses (GC, partition) while it holds records.
func (s *Source[T]) setPaused(p bool) { s.paused.Store(p) }

// Poll implements runtime.Source: it emits one batch a lane acquired,
// waiting a little (until the task has a barrier or notification to
// deliver, at most the poll wait) when none is ready. One batch per call,
// so that a barrier waits behind one lane's batch, not every ready lane's,
// and lanes cycle through checkpoints one behind the other. It asks for a
// checkpoint when it admitted a full batch (the input has a backlog), or
// when held batches no checkpoint covers yet block every lane or near the
// broker's per-partition cap, or (CommitWhenIdle) when no batch came for
// the idle-commit time while it holds records no checkpoint covers;
// otherwise the interval sets the pace (docs/architecture.md, "Share-group
// source pipeline").
func (s *Source[T]) Poll(ctx context.Context, out runtime.Collector[T]) error {
	if err := s.startLanes(); err != nil {
		return err
	}
	select {
	case err := <-s.fatal:
		return err
	default:
	}
	if err := s.housekeep(ctx); err != nil {
		return err
	}
	wait := s.cfg.pollWait
	if rest := s.cfg.idleCommit - time.Since(s.lastAdmitted); s.cfg.idleCommit > 0 && rest > 0 && s.uncovered() {
		wait = min(wait, rest) // wake to ask in time; once asked, the barrier interrupts the wait
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	backlog := false
	select {
	case l := <-s.ready:
		var err error
		if backlog, err = s.admit(ctx, l, out); err != nil {
			return err
		}
		s.lastAdmitted = time.Now()
	case err := <-s.fatal:
		return err
	case <-t.C:
	case <-s.oc.Interrupt():
	case <-ctx.Done():
		return ctx.Err()
	}
	near := s.nearLimit() // reports the in-flight window too
	if s.cfg.mode == Implicit || s.oc.RequestCheckpoint == nil {
		return nil
	}
	// Only a batch no checkpoint covers yet asks for one: once a
	// checkpoint covers every held batch, asking again would checkpoint
	// in a loop (each notification wakes Poll).
	switch {
	case backlog:
		s.oc.RequestCheckpoint("a full share-group batch was admitted: the input has a backlog")
	case !s.uncovered():
	case s.allHolding():
		s.oc.RequestCheckpoint("every share-group lane holds a batch")
	case near:
		s.oc.RequestCheckpoint("held share records near the per-partition cap")
	case s.cfg.idleCommit > 0 && time.Since(s.lastAdmitted) >= s.cfg.idleCommit:
		s.oc.RequestCheckpoint("no share-group batch arrived for the idle-commit time (CommitWhenIdle)")
	}
	return nil
}

// housekeep runs subtask 0's periodic work (every checkEvery): the check
// that the group still reads committed records only, and, transactional,
// the share start offset check and after it marker collection (at most
// every tombstoneEvery), and the measure of the backlog (pendingRecords)
// from the start offsets.
// A group found reading uncommitted records, or a start offset that skipped
// records, is unrecoverable; other failures are retried later.
func (s *Source[T]) housekeep(ctx context.Context) error {
	if s.oc.Subtask != 0 || time.Since(s.lastCheck) < s.cfg.checkEvery {
		return nil
	}
	s.lastCheck = time.Now()
	if err := s.checkIsolation(ctx); err != nil {
		return err
	}
	if s.cfg.mode != Transactional {
		starts, err := StartOffsets(ctx, s.admin, s.cfg.group)
		if err == nil {
			err = s.measurePending(ctx, starts)
		}
		if err != nil {
			s.log.Debug("pending records not measured; retried later", zap.Error(err))
		}
		return nil
	}
	starts, err := s.checkStarts(ctx)
	switch {
	case errors.Is(err, ErrRecordsSkipped):
		return err
	case err != nil:
		s.log.Warn("share start offset check failed; retried later", zap.Error(err))
		return nil
	}
	if err := s.measurePending(ctx, starts); err != nil {
		s.log.Debug("pending records not measured; retried later", zap.Error(err))
	}
	// Collection reuses the check's start offsets and caught-up index.
	if time.Since(s.lastGC) >= s.cfg.tombstoneEvery {
		s.lastGC = time.Now()
		if err := s.collectMarkers(ctx, starts); err != nil {
			s.log.Warn("ack-log marker collection failed; retried later", zap.Error(err))
		}
	}
	return nil
}

// measurePending measures the group's backlog on every input partition,
// Flink's pendingRecords: the log end offset minus the share partition's
// start offset (starts; below it every record is done), or minus the log
// start offset for a partition the group has not fetched yet (it starts
// there with share.auto.offset.reset=earliest; at the log end otherwise).
// The records counted include those the group holds (acquired, not yet
// acknowledged) and, on a transactional topic, the transaction markers'
// offsets.
func (s *Source[T]) measurePending(ctx context.Context, starts map[acklog.TopicPartition]int64) error {
	adm := kadm.NewClient(s.admin)
	ends, err := adm.ListEndOffsets(ctx, s.inputs()...)
	if err != nil {
		return fmt.Errorf("list end offsets: %w", err)
	}
	var logStarts kadm.ListedOffsets
	pending := map[acklog.TopicPartition]int64{}
	var errs []error
	ends.Each(func(lo kadm.ListedOffset) {
		tp := acklog.TopicPartition{Topic: lo.Topic, Partition: lo.Partition}
		if lo.Err != nil {
			errs = append(errs, fmt.Errorf("end offset of %s: %w", tp, lo.Err))
			return
		}
		start, ok := starts[tp]
		if !ok && s.cfg.resetEarliest {
			if logStarts == nil {
				if logStarts, err = adm.ListStartOffsets(ctx, s.inputs()...); err != nil {
					errs = append(errs, fmt.Errorf("list log start offsets: %w", err))
					return
				}
			}
			ls, found := logStarts.Lookup(lo.Topic, lo.Partition)
			if !found || ls.Err != nil {
				errs = append(errs, fmt.Errorf("log start offset of %s: %v", tp, ls.Err))
				return
			}
			start = ls.Offset
		} else if !ok {
			start = lo.Offset
		}
		pending[tp] = max(lo.Offset-start, 0)
	})
	if err := errors.Join(errs...); err != nil {
		return err
	}
	s.pendingMu.Lock()
	s.pending = pending
	s.pendingMu.Unlock()
	return nil
}

// pendingRecords is subtask 0's last measure of the backlog per input
// partition (nil before the first, and on other subtasks).
func (s *Source[T]) pendingRecords() map[acklog.TopicPartition]int64 {
	s.pendingMu.Lock()
	defer s.pendingMu.Unlock()
	return maps.Clone(s.pending)
}

// checkIsolation fails the job (unrecoverable, wrapping ErrReadUncommitted)
// if the group's share.isolation.level is no longer read_committed (an
// administrator changed it, a broker lost it): records of aborted
// transactions may have been handed out since, and a restart cannot take
// their effects back. A failed request is logged and retried at the next
// check.
func (s *Source[T]) checkIsolation(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := checkIsolation(cctx, s.admin, s.cfg.group)
	switch {
	case errors.Is(err, ErrReadUncommitted):
		return runtime.Unrecoverable(fmt.Errorf("%w (changed while the job ran: records of open or aborted "+
			"transactions may have been processed since the last check)", err))
	case err != nil:
		s.log.Warn("share group isolation level check failed; retried later", zap.Error(err))
	}
	return nil
}

// checkStarts compares the group's share start offsets with the ack-log.
// Below a share start offset every record is acknowledged for good, so every
// offset between a partition's watermark (where the previous check left it;
// at first sight, the lower of the start offset and the lowest offset a
// marker covers) and its start offset must be covered by a committed
// marker: if not, the broker skipped records the job never processed (share
// state lost or reset, records archived), and the job fails with
// ErrRecordsSkipped naming them, never silently. Offsets an Open marker
// covers are undecided (Index.WithoutOpen): the partition is judged again at
// the next check, its watermark unmoved. A start that moved back
// (state reset to an earlier offset) is fine: the lookup recognises what
// comes back. Watermarks then advance to the start offsets, and an input
// partition the group has not fetched yet gets one at its log start offset
// (unstarted).
func (s *Source[T]) checkStarts(ctx context.Context) (map[acklog.TopicPartition]int64, error) {
	starts, err := StartOffsets(ctx, s.admin, s.cfg.group)
	if err != nil {
		return nil, err
	}
	if err := s.ix.CatchUpToEnd(ctx); err != nil {
		return nil, fmt.Errorf("ack-log: %w", err)
	}
	var skipped []string
	var advance []*kgo.Record
	for tp, start := range starts {
		if !slices.Contains(s.inputs(), tp.Topic) {
			continue
		}
		wm, ok := s.ix.Watermark(tp)
		if !ok {
			// First sight: the group starts at its start offset, or
			// earlier, where its first markers are.
			wm = start
			if low, found := s.ix.Lowest(tp); found {
				wm = min(wm, low)
			}
		}
		if start > wm {
			// What an open marker covers is undecided: the marker may
			// have committed, its commit not readable yet, while its
			// committer already acknowledged the records. The rest is
			// judged now: a skip beside an open marker is reported at
			// once, not when the marker resolves.
			decided, undecided := s.ix.WithoutOpen(tp, s.ix.Uncovered(tp, wm, start))
			gaps, err := s.deliverable(ctx, tp, decided)
			if err != nil {
				return nil, err
			}
			if len(gaps) > 0 {
				skipped = append(skipped, fmt.Sprintf("%s offsets %s", tp, fmtRanges(gaps)))
				continue
			}
			if undecided {
				// The next check decides; the watermark stays.
				s.log.Debug("share start offset check: open markers cover offsets below the start; decided at the next check",
					zap.Stringer("partition", tp), zap.Int64("watermark", wm), zap.Int64("start", start))
				continue
			}
		} else if ok {
			continue
		}
		advance = append(advance, acklog.Watermark{Group: s.cfg.group, TP: tp, Offset: start}.Record(s.cfg.ackLogTopic))
	}
	unstarted, err := s.unstarted(ctx, starts)
	if err != nil {
		return nil, err
	}
	for tp, logStart := range unstarted {
		advance = append(advance, acklog.Watermark{Group: s.cfg.group, TP: tp, Offset: logStart}.Record(s.cfg.ackLogTopic))
	}
	if len(skipped) > 0 {
		slices.Sort(skipped)
		return nil, runtime.Unrecoverable(fmt.Errorf("%w: group %q, %s: the share start offset moved past records that no "+
			"committed ack marker covers (share-group state lost or reset, or records archived by the broker); "+
			"rewind the group's share offsets to re-read them", ErrRecordsSkipped, s.cfg.group, strings.Join(skipped, "; ")))
	}
	if len(advance) > 0 {
		if err := s.admin.ProduceSync(ctx, advance...).FirstErr(); err != nil {
			return nil, fmt.Errorf("write ack-log watermarks: %w", err)
		}
	}
	return starts, nil
}

// unstarted returns the input partitions the group has no share state
// for yet (starts has none) and the ack-log no watermark for, with their
// log start offsets: with share.auto.offset.reset=earliest the group
// starts there at its first fetch, so that is their watermark. Without it,
// the first check that saw such a partition took its share start offset
// then for where the group started, and records skipped between the
// group's first fetch and that check went unreported. With
// StartFromLatest (the group starts at the log end of its first fetch)
// there is nothing to watermark before it: none.
func (s *Source[T]) unstarted(ctx context.Context, starts map[acklog.TopicPartition]int64) (map[acklog.TopicPartition]int64, error) {
	if !s.cfg.resetEarliest {
		return nil, nil
	}
	los, err := kadm.NewClient(s.admin).ListStartOffsets(ctx, s.inputs()...)
	if err != nil {
		return nil, fmt.Errorf("list log start offsets: %w", err)
	}
	out := map[acklog.TopicPartition]int64{}
	var errs []error
	los.Each(func(lo kadm.ListedOffset) {
		tp := acklog.TopicPartition{Topic: lo.Topic, Partition: lo.Partition}
		if _, ok := starts[tp]; ok {
			return
		}
		if _, ok := s.ix.Watermark(tp); ok {
			return
		}
		if lo.Err != nil {
			errs = append(errs, fmt.Errorf("log start offset of %s: %w", tp, lo.Err))
			return
		}
		out[tp] = lo.Offset
	})
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// deliverable narrows gaps of tp to the offsets that hold records a share
// group delivers: a transactional topic (the retry topic) also has offsets
// no consumer ever sees (commit and abort markers, aborted data), which the
// share start offset passes without any ack marker covering them. It reads
// the gaps read_committed with control records kept, until it has seen an
// offset at or past the last gap offset: the share start offset is at most
// the last stable offset, so that offset is a committed record or a
// marker, or aborted data whose abort marker comes after it. A read that
// does not get there in time is an error (the caller retries), never a
// verdict; offsets it returns are deliverable.
func (s *Source[T]) deliverable(ctx context.Context, tp acklog.TopicPartition, gaps []acklog.Range) ([]acklog.Range, error) {
	if len(gaps) == 0 {
		return nil, nil
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(s.cfg.brokers...), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{tp.Topic: {tp.Partition: kgo.NewOffset().At(gaps[0].Start)}})},
		s.cfg.clientOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("read skipped offsets: %w", err)
	}
	defer cl.Close()
	last := gaps[len(gaps)-1].End - 1
	var offs []int64
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for seen := false; !seen; {
		fs := cl.PollFetches(rctx)
		if err := rctx.Err(); err != nil {
			return nil, fmt.Errorf("read skipped offsets of %s up to %d: %w", tp, last, err)
		}
		if err := fs.Err0(); err != nil {
			return nil, fmt.Errorf("read skipped offsets of %s: %w", tp, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset >= last {
				seen = true
			}
			if r.Attrs.IsControl() || r.Offset > last {
				return
			}
			for _, g := range gaps {
				if r.Offset >= g.Start && r.Offset < g.End {
					offs = append(offs, r.Offset)
				}
			}
		})
	}
	return acklog.RangesOf(map[acklog.TopicPartition][]int64{tp: offs})[tp], nil
}

// fmtRanges prints ranges as "[a, b)" lists, at most five.
func fmtRanges(rs []acklog.Range) string {
	var b strings.Builder
	for i, r := range rs {
		if i == 5 {
			fmt.Fprintf(&b, " and %d more", len(rs)-5)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "[%d, %d)", r.Start, r.End)
	}
	return b.String()
}

// collectMarkers tombstones ack markers that can no longer matter: every
// record they cover is below its partition's share start offset (done for
// good, and below the watermark checkStarts wrote), and they are older than
// the grace period (default 10x the lock duration; a tombstoned marker no
// longer stops a zombie, so the grace period bounds how long a paused
// process can stay one). Subtask 0 does it outside any transaction, right
// after checkStarts, with the start offsets it read and the index it caught
// up.
func (s *Source[T]) collectMarkers(ctx context.Context, starts map[acklog.TopicPartition]int64) error {
	grace := s.cfg.grace
	if grace == 0 {
		lock := 30 * time.Second
		for _, l := range s.lanes {
			l.mu.Lock()
			if l.clock.dur > 0 {
				lock = l.clock.dur
			}
			l.mu.Unlock()
		}
		grace = 10 * lock
	}
	// Only what a watermark already covers may go: the watermark is what
	// keeps recognising those records once their markers are gone.
	wms := map[acklog.TopicPartition]int64{}
	for tp, start := range starts {
		if wm, ok := s.ix.Watermark(tp); ok {
			wms[tp] = min(wm, start)
		}
	}
	tombs := s.ix.Tombstones(wms, time.Now(), grace)
	if len(tombs) == 0 {
		return nil
	}
	if err := s.admin.ProduceSync(ctx, tombs...).FirstErr(); err != nil {
		return fmt.Errorf("tombstone %d ack markers: %w", len(tombs), err)
	}
	s.log.Debug("ack markers tombstoned", zap.Int("markers", len(tombs)))
	return nil
}

// StartOffsets reads the share-partition start offsets of a group
// (DescribeShareGroupOffsets): below them every record is done
// (acknowledged or archived). A partition the group has not read yet is
// missing.
func StartOffsets(ctx context.Context, cl *kgo.Client, group string) (map[acklog.TopicPartition]int64, error) {
	req := kmsg.NewPtrDescribeShareGroupOffsetsRequest()
	g := kmsg.NewDescribeShareGroupOffsetsRequestGroup()
	g.GroupID = group
	req.Groups = append(req.Groups, g)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("describe share group offsets: %w", err)
	}
	out := map[acklog.TopicPartition]int64{}
	for _, rg := range resp.Groups {
		if err := kerr.ErrorForCode(rg.ErrorCode); err != nil {
			return nil, fmt.Errorf("describe share group offsets of %q: %w", group, err)
		}
		for _, t := range rg.Topics {
			for _, p := range t.Partitions {
				if kerr.ErrorForCode(p.ErrorCode) == nil && p.StartOffset >= 0 {
					out[acklog.TopicPartition{Topic: t.Topic, Partition: p.Partition}] = p.StartOffset
				}
			}
		}
	}
	return out, nil
}

// inFlight counts held records per topic-partition.
func (s *Source[T]) inFlight() map[acklog.TopicPartition]int {
	held := map[acklog.TopicPartition]int{}
	for _, l := range s.lanes {
		l.mu.Lock()
		for tp, n := range l.perTP {
			held[tp] += n
		}
		l.mu.Unlock()
	}
	return held
}

// nearLimit reports whether some partition's held records reached 80% of the
// broker's cap, and reports the window to the observer.
func (s *Source[T]) nearLimit() bool {
	held := s.inFlight()
	if s.cfg.observe != nil {
		s.cfg.observe(held, s.limit)
	}
	for _, n := range held {
		if n*5 >= s.limit*4 {
			return true
		}
	}
	return false
}

// allHolding reports whether no lane can take more work until a checkpoint
// completes: none is idle or ready.
func (s *Source[T]) allHolding() bool {
	for _, l := range s.lanes {
		l.mu.Lock()
		st := l.state
		l.mu.Unlock()
		if st == laneIdle || st == laneReady || st == laneAdmitting {
			return false
		}
	}
	return true
}

// uncovered reports whether a lane holds a batch that no checkpoint
// covers yet: its records are held until one completes.
func (s *Source[T]) uncovered() bool {
	for _, l := range s.lanes {
		l.mu.Lock()
		st, epoch := l.state, l.epoch
		l.mu.Unlock()
		if st == laneHolding && epoch == 0 {
			return true
		}
	}
	return false
}

// admit sorts a lane's fresh batch: already processed (ACCEPT later, skip),
// covered by an open marker (set aside), poison or undecodable (dead letter,
// REJECT), lock nearly expired (RELEASE unprocessed), or emitted. Every
// record is looked up in the ack-log, whatever its delivery count: a share
// partition whose state was lost or reset redelivers committed records at
// count 1. It holds no lock while it emits: downstream back-pressure never
// stops the renewals of this or any other lane. backlog reports a full
// batch with records a checkpoint must carry (emitted or rejected, not
// implicit): more input is waiting behind it.
func (s *Source[T]) admit(ctx context.Context, l *lane, out runtime.Collector[T]) (backlog bool, err error) {
	l.mu.Lock()
	if l.fetchErr != nil {
		s.log.Warn("share fetch error", zap.String("lane", l.name), zap.Error(l.fetchErr))
	}
	batch := l.batch
	l.batch, l.state, l.epoch = nil, laneAdmitting, 0
	margin := lockMargin(s.cfg.lockMargin, l.clock.dur)
	clock := l.clock // as renewed so far
	// Partitions whose renewal the broker refused while the batch waited:
	// their records are no longer (all) ours, and nothing of them was
	// emitted yet, so they are released here instead of emitted; once
	// emitted, the checkpoint would have to decline (lockClock.lapsed) and
	// roll the whole job back for records nobody processed.
	lost := maps.Clone(l.clock.lost)
	clock.lost = lost
	l.mu.Unlock()
	if s.cfg.mode == Transactional && len(batch) > 0 {
		if err := s.ix.CatchUpToEnd(ctx); err != nil {
			return false, fmt.Errorf("ack-log: %w", err)
		}
	}
	now := time.Now()
	var stale, emitted, rejected, accepted, requeue []*kgo.Record
	var aside []asideRec
	for _, r := range batch {
		if clock.isLost(r) {
			stale = append(stale, r)
			continue
		}
		v, e, cause := s.judge(r, &clock, now, margin)
		switch v {
		case verdictStale:
			stale = append(stale, r)
			continue
		case verdictProcessed:
			s.counters.deduplicated.Add(1)
			accepted = append(accepted, r)
			continue
		case verdictAside:
			aside = append(aside, asideRec{r: r, marker: e})
			continue
		case verdictRequeue:
			requeue = append(requeue, r)
			continue
		case verdictPoison:
			if err := s.deadLetter(ctx, r, cause); err != nil {
				return false, err
			}
			rejected = append(rejected, r)
			continue
		}
		val, err := s.decode(r)
		if err != nil {
			if err := s.deadLetter(ctx, r, fmt.Errorf("decode: %w", err)); err != nil {
				return false, err
			}
			rejected = append(rejected, r)
			continue
		}
		collectStamped(out, val, r)
		emitted = append(emitted, r)
	}
	if len(stale) > 0 {
		s.counters.nearExpiry.Add(int64(len(stale)))
		s.log.Info("releasing records whose lock was refused or too close to expiry to process", zap.String("lane", l.name), zap.Int("records", len(stale)))
		// Out of held before the release, under the acknowledgement
		// lock: a renewal after it must not renew released records (the
		// broker would refuse the partition, and the epoch roll back).
		l.ack.mu.Lock()
		l.mu.Lock()
		l.drop(stale)
		// The lane holds nothing of a partition refused before admission
		// any more (every record of it is in stale, and a ready lane holds
		// its batch only): it is not lost to this batch's epoch. One first
		// refused since stays lost: its records may have been emitted.
		for tp := range lost {
			delete(l.clock.lost, tp)
		}
		l.mu.Unlock()
		refused, err := l.ack.ackLocked(ctx, kgo.AckRelease, stale...)
		l.ack.mu.Unlock()
		if err != nil || len(refused) > 0 {
			s.log.Warn("releasing stale records failed; they come back when their lock expires", zap.String("lane", l.name),
				zap.Error(errors.Join(err, refusedErr(refused))))
		}
	}
	if len(requeue) > 0 {
		waiting, err := s.requeue(ctx, l, requeue)
		if err != nil {
			return false, err
		}
		aside = append(aside, waiting...)
	}
	if ce := s.log.Check(zap.DebugLevel, "share batch admitted"); ce != nil {
		ce.Write(zap.String("lane", l.name), zap.Int("records", len(batch)), zap.Int("emitted", len(emitted)),
			zap.Int("already_processed", len(accepted)), zap.Int("set_aside", len(aside)),
			zap.Int("rejected", len(rejected)), zap.Int("released_stale", len(stale)), zap.Int("requeued", len(requeue)))
	}
	l.mu.Lock()
	l.emitted, l.rejected, l.accepted, l.aside = emitted, rejected, accepted, aside
	l.state, l.admitted = laneHolding, true
	l.count()
	l.mu.Unlock()
	// A batch with nothing to carry through a checkpoint finishes now:
	// already-processed records are ACCEPTed at once.
	if s.cfg.mode == Implicit || len(emitted)+len(rejected) == 0 {
		if _, err := l.finish(ctx, inState(laneHolding), s.asideOutcome(ctx)); err != nil {
			s.log.Warn("acknowledging an admitted batch failed; its records come back and are judged again",
				zap.String("lane", l.name), zap.Error(err))
		}
		return false, nil
	}
	return len(batch) >= s.cfg.batch, nil
}

// verdict is what the source does with a delivered record (judge).
type verdict uint8

const (
	verdictEmit      verdict = iota // decode and emit it
	verdictStale                    // its lock is too close to expiry: release it unprocessed
	verdictProcessed                // a committed marker (or a watermark) covers it: ACCEPT, do not emit
	verdictAside                    // a still-open marker covers it: hold it until the marker ends
	verdictRequeue                  // at the end of its delivery budget, unprocessed: re-queue it
	verdictPoison                   // dead-letter and REJECT it (the cause says why)
)

// judge decides what becomes of a delivered record, before decoding: the
// lookup runs for every record, whatever its delivery count (a reset share
// partition redelivers committed records at count 1); the index must be
// caught up to the ack-log's end. The entry is the covering marker
// (processed, aside); the cause is a poison record's.
//
// The lock's time left is read on clock, the holder's clock of r's batch:
// a batch that waited, renewed, behind a blocked task is judged by its last
// accepted renewal, not by its acquisition. And only a record that would be
// emitted is released for its lock: one a marker covers, or at the end of
// its delivery budget, is settled (ACCEPTed, set aside, re-queued or
// dead-lettered) whatever its lock's time left, because a release costs a
// delivery (docs/architecture.md, "Delivery budget"). That is safe: a
// lapse during a re-queue is caught by the re-queue's conflict check, and
// a refused ACCEPT only brings the record back, recognised.
func (s *Source[T]) judge(r *kgo.Record, clock *lockClock, now time.Time, margin time.Duration) (verdict, acklog.Entry, error) {
	emit := verdictEmit
	if clock.expiresSoon(r, now, margin) {
		emit = verdictStale
	}
	if s.cfg.mode != Transactional {
		if r.DeliveryCount() >= s.cfg.maxDeliveries {
			return verdictPoison, acklog.Entry{}, fmt.Errorf("delivered %d times (max %d)", r.DeliveryCount(), s.cfg.maxDeliveries)
		}
		return emit, acklog.Entry{}, nil
	}
	if e, ok := s.ix.Lookup(acklog.TopicPartition{Topic: r.Topic, Partition: r.Partition}, r.Offset); ok {
		if e.Status == acklog.Committed {
			return verdictProcessed, e, nil
		}
		return verdictAside, e, nil
	}
	if r.DeliveryCount() < s.requeueAt {
		return emit, acklog.Entry{}, nil
	}
	if s.cfg.maxRequeues > 0 && requeues(r) >= s.cfg.maxRequeues {
		return verdictPoison, acklog.Entry{}, fmt.Errorf("re-queued %d times (max %d), delivered %d times", requeues(r),
			s.cfg.maxRequeues, r.DeliveryCount())
	}
	return verdictRequeue, acklog.Entry{}, nil
}

// asideOutcome returns how a set-aside record is resolved at a lane's
// finalization: ACCEPT if its marker committed, RELEASE if it aborted (or
// was forgotten), 0 (keep holding) while it is open. The index is caught up
// once, at the first call.
func (s *Source[T]) asideOutcome(ctx context.Context) func(acklog.Entry) kgo.AckStatus {
	if s.cfg.mode != Transactional {
		return func(acklog.Entry) kgo.AckStatus { return kgo.AckRelease }
	}
	caught := false
	return func(m acklog.Entry) kgo.AckStatus {
		if !caught {
			caught = true
			cctx, cancel := context.WithTimeout(ctx, resolveTimeout)
			err := s.ix.CatchUpToEnd(cctx)
			cancel()
			if err != nil {
				s.log.Warn("reading the ack-log failed; set-aside records stay held", zap.Error(err))
			}
		}
		e, ok := s.ix.Status(m.Offset)
		switch {
		case !ok || e.Status == acklog.Aborted:
			return kgo.AckRelease
		case e.Status == acklog.Committed:
			return kgo.AckAccept
		}
		return 0
	}
}

// inputs are the topics the lanes read: the configured ones and, in
// transactional mode, the group's retry topic.
func (s *Source[T]) inputs() []string {
	if s.cfg.mode != Transactional {
		return s.cfg.topics
	}
	return append(slices.Clone(s.cfg.topics), s.cfg.requeueTopic)
}

// deadLetter copies r to the dead-letter topic, in the current transaction in
// transactional mode (internal/deadletter, shared with the partition
// source).
func (s *Source[T]) deadLetter(ctx context.Context, r *kgo.Record, cause error) error {
	if err := deadletter.Send(ctx, s.txn, s.log, r, s.cfg.dlqTopic, cause, s.oc.RestartCause); err != nil {
		return err
	}
	s.counters.deadLetters.Add(1)
	return nil
}

// Snapshot implements runtime.Source. Every batch emitted since the last
// barrier belongs to checkpoint id. In transactional mode the source declines
// when a lane's locks may have lapsed (by its own clock, or a renewal the
// broker refused) or when an offset was acquired twice within the epoch (a
// lane's lock lapsed and the record was redelivered to another lane of this
// subtask); otherwise it writes the epoch's ack marker into the checkpoint's
// transaction and runs the conflict check, aborting its transaction at once
// if it loses; then it pre-commits.
func (s *Source[T]) Snapshot(ctx context.Context, id checkpoint.ID) (runtime.OperatorState, error) {
	var epoch []*lane
	for _, l := range s.lanes {
		l.mu.Lock()
		if l.state == laneHolding && l.epoch == 0 {
			l.epoch = id
		}
		if l.state == laneHolding && l.epoch == id {
			epoch = append(epoch, l)
		}
		l.mu.Unlock()
	}
	if s.cfg.mode != Transactional {
		if err := s.txn.Flush(ctx); err != nil {
			return runtime.OperatorState{}, fmt.Errorf("flush dead letters: %w", err)
		}
		return runtime.OperatorState{}, nil
	}
	now := time.Now()
	offsets := map[acklog.TopicPartition][]int64{}
	for _, l := range epoch {
		l.mu.Lock()
		lapsed := l.clock.lapsed(now, lockMargin(s.cfg.lockMargin, l.clock.dur))
		l.offsets(offsets)
		l.mu.Unlock()
		if lapsed != nil {
			s.counters.lapsed.Add(1)
			return runtime.OperatorState{}, fmt.Errorf("%w: %s: %w", checkpoint.ErrDeclined, l.name, lapsed)
		}
	}
	if dup := twice(offsets); dup != "" {
		s.counters.lapsed.Add(1)
		return runtime.OperatorState{}, fmt.Errorf("%w: %s: offset %s was acquired twice in checkpoint %d's epoch: a lane's lock "+
			"lapsed and the broker redelivered the record to another lane", checkpoint.ErrDeclined, s.member, dup, id)
	}
	if len(offsets) > 0 {
		cur, err := s.txn.Current(ctx)
		if err != nil {
			return runtime.OperatorState{}, fmt.Errorf("ack-marker transaction: %w", err)
		}
		m := acklog.Marker{Group: s.cfg.group, Member: s.member, Checkpoint: uint64(id), TransactionalID: cur.TransactionalID,
			ProducerID: cur.ProducerID, Ranges: acklog.RangesOf(offsets), CreatedAt: now}
		rec := m.Record(s.cfg.ackLogTopic)
		if err := s.txn.Write(ctx, rec); err != nil {
			return runtime.OperatorState{}, fmt.Errorf("write ack marker: %w", err)
		}
		if err := s.txn.Flush(ctx); err != nil {
			return runtime.OperatorState{}, fmt.Errorf("flush ack marker: %w", err)
		}
		if err := s.ix.CatchUp(ctx, rec.Offset+1); err != nil {
			return runtime.OperatorState{}, fmt.Errorf("ack-log: %w", err)
		}
		own := acklog.Entry{Marker: m, Offset: rec.Offset, Status: acklog.Open, ProducerEpoch: rec.ProducerEpoch}
		if cs := s.ix.Conflicts(own); len(cs) > 0 {
			s.abortDeclined(ctx, id)
			return runtime.OperatorState{}, fmt.Errorf("%w: ack marker at %d overlaps an earlier %s marker at %d (%s, checkpoint %d): "+
				"these records were processed elsewhere (a lock expired)", checkpoint.ErrDeclined, rec.Offset,
				cs[0].Status, cs[0].Offset, cs[0].Marker.TransactionalID, cs[0].Marker.Checkpoint)
		}
		s.below = max(s.below, rec.Offset+1)
	}
	if _, _, err := s.txn.PreCommit(ctx, id); err != nil {
		return runtime.OperatorState{}, fmt.Errorf("pre-commit: %w", err)
	}
	if err := s.oc.Inject(FailpointAfterAckPrecommit); err != nil {
		return runtime.OperatorState{}, err
	}
	return runtime.OperatorState{Entries: [][]byte{lineage{Below: s.below, Prefix: s.prefix}.encode()}, Handles: s.txn.Pending()}, nil
}

// abortDeclined aborts the transaction of a marker that lost the conflict
// check, at once: redeliveries must not be set aside behind it, and a lost
// abort notification must not let it be pre-committed with the next
// checkpoint.
func (s *Source[T]) abortDeclined(ctx context.Context, id checkpoint.ID) {
	_, _, err := s.txn.PreCommit(ctx, id)
	if err == nil {
		err = s.txn.Abort(ctx, id)
	}
	if err != nil {
		s.log.Warn("aborting a declined ack marker's transaction failed; the task fails and recovery aborts it",
			zap.Uint64("checkpoint", uint64(id)), zap.Error(err))
		select {
		case s.fatal <- fmt.Errorf("abort the declined marker of checkpoint %d: %w", id, err):
		default:
		}
	}
}

// twice returns "topic[partition]@offset" for an offset that appears twice,
// or "".
func twice(offsets map[acklog.TopicPartition][]int64) string {
	for tp, offs := range offsets {
		sorted := slices.Clone(offs)
		slices.Sort(sorted)
		for i := 1; i < len(sorted); i++ {
			if sorted[i] == sorted[i-1] {
				return fmt.Sprintf("%s@%d", tp, sorted[i])
			}
		}
	}
	return ""
}

// NotifyCheckpointComplete implements checkpoint.Listener: commit the marker
// transactions up to id, then have the lanes ACCEPT (or REJECT) the records
// they cover, each on its own goroutine, so that the task goroutine goes
// back to emitting at once. A lane whose goroutine no longer runs (the
// source stopped fetching) is finished here, or by Close, before anything
// is released.
func (s *Source[T]) NotifyCheckpointComplete(ctx context.Context, id checkpoint.ID) error {
	if s.cfg.mode == Transactional {
		if err := s.txn.Commit(ctx, id); err != nil {
			return fmt.Errorf("commit ack markers of checkpoint %d: %w", id, err)
		}
		if err := s.oc.Inject(FailpointAfterAckCommit); err != nil {
			return err
		}
	}
	s.completed.Note(id)
	s.life.Lock()
	async := s.started && !s.fetchStopped
	s.life.Unlock()
	if !async {
		s.finishCompleted(ctx, id)
		return nil
	}
	for _, l := range s.lanes {
		l.poke()
	}
	return nil
}

// finishCompleted finishes (ACCEPTs), on the calling goroutine, every lane
// holding records of an epoch up to the completed checkpoint id, whose
// markers are committed.
func (s *Source[T]) finishCompleted(ctx context.Context, id checkpoint.ID) {
	outcome := s.asideOutcome(ctx)
	for _, l := range s.lanes {
		s.finishLane(ctx, l, id, outcome)
	}
}

// finishLane finishes l's epoch if the completed checkpoint id covers it.
// The commit point passed: a refused or lost ACCEPT only means the records
// come back and are recognised as processed.
func (s *Source[T]) finishLane(ctx context.Context, l *lane, id checkpoint.ID, outcome func(acklog.Entry) kgo.AckStatus) {
	if refused, err := l.finish(ctx, completedBy(id), outcome); err != nil || len(refused) > 0 {
		s.log.Warn("the broker did not confirm the acknowledgement of a completed epoch; its records will be "+
			"redelivered and recognised by the ack-log", zap.String("lane", l.name), zap.Error(errors.Join(err, refusedErr(refused))))
	}
}

// NotifyCheckpointAborted implements checkpoint.Listener. At least once, the
// epoch's records stay held and join the next checkpoint. Transactional, an
// aborted checkpoint that covered held records fails the task so the job
// rolls back to the last completed checkpoint (the records' effects are in
// downstream state that is rolled back with it).
func (s *Source[T]) NotifyCheckpointAborted(ctx context.Context, id checkpoint.ID) error {
	if s.cfg.mode == Transactional {
		// Abort the epoch's marker at once, so a redelivery of its records
		// is not set aside behind it.
		if err := s.txn.Abort(ctx, id); err != nil {
			return fmt.Errorf("abort ack markers of checkpoint %d: %w", id, err)
		}
	}
	// An epoch a completed checkpoint covers is not rolled back (its lane
	// may not have finished it yet).
	done := completedBy(s.completed.Load())
	for _, l := range s.lanes {
		l.mu.Lock()
		covered := completedBy(id)(l) && !done(l)
		if covered && s.cfg.mode != Transactional {
			l.epoch = 0
		}
		l.mu.Unlock()
		if covered && s.cfg.mode == Transactional {
			return fmt.Errorf("%w (checkpoint %d)", ErrRolledBack, id)
		}
	}
	return nil
}

// renewLoop renews the locks of held records, without polling. It never
// waits on the task goroutine, downstream, or any broker call other than
// the renewals themselves (each bounded): the ack-log reads and aborts that
// resolve parked lanes run on resolveLoop.
func (s *Source[T]) renewLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.renewTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if s.paused.Load() {
				continue
			}
			// Each lane renews on its own client and connection, all at
			// once: one after another, a slow broker's answers would add
			// up, and a subtask's last lane would renew only after every
			// other lane's round trip (TestASlowBrokerDoesNotAddTheLanesRenewalsUp).
			var wg sync.WaitGroup
			for _, l := range s.lanes {
				wg.Go(func() {
					if err := l.renew(ctx, now); err != nil && ctx.Err() == nil {
						s.log.Warn("renewing held records failed; the lane's epoch will decline if its locks are gone",
							zap.String("lane", l.name), zap.Error(err))
					}
				})
			}
			wg.Wait()
		}
	}
}

// resolveTimeout bounds one round of resolveParked's broker calls.
const resolveTimeout = 10 * time.Second

// resolveLoop resolves parked lanes' set-aside records as their markers
// end, every renew tick, on its own goroutine: a slow ack-log read or
// stale-marker abort never delays a renewal.
func (s *Source[T]) resolveLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.renewTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if s.paused.Load() {
				continue
			}
			rctx, cancel := context.WithTimeout(ctx, resolveTimeout)
			s.resolveParked(rctx)
			cancel()
		}
	}
}

// resolveParked finishes parked lanes whose set-aside records' markers
// ended. A foreign marker (another job's transactional id) open longer than
// the open-marker wait is stale: its transaction is aborted by its recorded
// handle, so its records are redelivered instead of waiting for the broker's
// transaction timeout. A marker of this job is never aborted here: its
// checkpoint's coordinator decides it.
func (s *Source[T]) resolveParked(ctx context.Context) {
	var parked []*lane
	for _, l := range s.lanes {
		l.mu.Lock()
		if l.state == laneParked {
			parked = append(parked, l)
		}
		l.mu.Unlock()
	}
	if len(parked) == 0 || s.cfg.mode != Transactional {
		return
	}
	outcome := s.asideOutcome(ctx)
	for _, l := range parked {
		if _, err := l.finish(ctx, inState(laneParked), func(m acklog.Entry) kgo.AckStatus {
			st := outcome(m)
			if st == 0 && !s.ownMarker(m) && !s.stale[m.Offset] &&
				time.Since(m.Marker.CreatedAt) > s.cfg.openWait {
				s.stale[m.Offset] = true
				abortStaleMarker(ctx, s.admin, m, s.cfg.openWait, s.log)
			}
			return st
		}); err != nil && ctx.Err() == nil {
			s.log.Warn("resolving set-aside records failed; retried", zap.String("lane", l.name), zap.Error(err))
		}
	}
}

// ownMarker reports whether a marker was written by this job: by its
// marker writer or its re-queue writer, by their exact transactional-id
// format (a job whose prefix extends this one's is another job).
func (s *Source[T]) ownMarker(e acklog.Entry) bool {
	id := e.Marker.TransactionalID
	return kafkatxn.IsTransactionalIDOf(s.prefix, id) || kafkatxn.IsTransactionalIDOf(s.prefix+requeuePrefixSuffix, id)
}

// NotifyJobCanceled implements checkpoint.CancelListener: the job ends for
// good (cancelled, not restarted) and lastCompleted is its latest completed
// checkpoint (0: none). The source commits the marker transactions that
// checkpoint covers (its notification may have been lost or overtaken by
// the cancel), ACCEPTs the records of those epochs, aborts every later
// marker, pre-committed or open, and then releases every held record: a
// cancelled job leaves no open transaction and no held record behind.
func (s *Source[T]) NotifyJobCanceled(ctx context.Context, lastCompleted checkpoint.ID) error {
	var err error
	if s.txn != nil {
		err = s.txn.EndJob(ctx, lastCompleted)
	}
	// The epochs up to lastCompleted are committed (EndJob committed their
	// markers if their notification never came): stopLanes ACCEPTs their
	// records before it releases the rest, or the release would hand
	// processed records to the next consumer; and a record must not reach
	// another consumer while a marker of ours still covers it.
	if err == nil {
		s.completed.Note(lastCompleted)
	}
	s.stopLanes()
	if err != nil {
		return fmt.Errorf("cancel: %w", err)
	}
	return nil
}

// stopLanes stops polling and renewing and closes every lane's client,
// which releases its held records at once. First every lane of every
// sibling of this attempt stops fetching, so that no lane in this process
// acquires what another releases; then the epochs a completed checkpoint
// covers that the lanes' goroutines did not finish are ACCEPTed, and the
// batches acquired and never admitted are judged (settle); only then are
// records released.
// Idempotent.
func (s *Source[T]) stopLanes() {
	if s.stopped {
		return
	}
	s.stopped = true
	if s.sib != nil {
		s.sib.stopFetching(s.sibKey)
	}
	s.stopFetching()
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	// The lanes' goroutines ended: ACCEPT what a completed checkpoint
	// covers that they did not finish, before it is released.
	if c := s.completed.Load(); c > 0 {
		s.finishCompleted(ctx, c)
	}
	s.settle(ctx)
	cancel()
	s.life.Lock()
	stop := s.cancel
	s.life.Unlock()
	if stop != nil {
		stop()
	}
	s.wg.Wait()
	var wg sync.WaitGroup
	for _, l := range s.lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.close()
		}()
	}
	wg.Wait()
}

// settleTimeout bounds the work Close does before it releases records.
const settleTimeout = 10 * time.Second

// settle judges, at Close, the batches lanes acquired that the source
// never admitted (the attempt ended first): each cost a delivery. As admit
// would, it ACCEPTs what a committed marker covers and re-queues what is at
// the end of its delivery budget; the rest is released unprocessed when
// the lanes close. So attempts that fail before they admit anything cannot
// walk a record up to the broker's delivery limit. Failures are logged: the
// records are then released, as before.
func (s *Source[T]) settle(ctx context.Context) {
	if s.cfg.mode != Transactional || s.ix == nil {
		return
	}
	caught := false
	for _, l := range s.lanes {
		l.mu.Lock()
		var batch []*kgo.Record
		if l.state == laneReady {
			batch = l.batch
		}
		margin := lockMargin(s.cfg.lockMargin, l.clock.dur)
		clock := l.clock
		l.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		if !caught {
			if err := s.ix.CatchUpToEnd(ctx); err != nil {
				s.log.Warn("closing: reading the ack-log failed; batches never admitted are released unjudged", zap.Error(err))
				return
			}
			caught = true
		}
		now := time.Now()
		var accept, requeue []*kgo.Record
		for _, r := range batch {
			switch v, _, _ := s.judge(r, &clock, now, margin); v {
			case verdictProcessed:
				accept = append(accept, r)
			case verdictRequeue:
				requeue = append(requeue, r)
			}
		}
		if len(accept) > 0 {
			if err := l.acceptNow(ctx, accept); err != nil {
				s.log.Warn("closing: accepting already-processed records failed; they come back and are recognised",
					zap.String("lane", l.name), zap.Error(err))
			}
		}
		if len(requeue) > 0 {
			if _, err := s.requeue(ctx, l, requeue); err != nil {
				s.log.Warn("closing: re-queueing records at the end of their delivery budget failed; they are released",
					zap.String("lane", l.name), zap.Int("records", len(requeue)), zap.Error(err))
			}
		}
		if ce := s.log.Check(zap.DebugLevel, "closing: a batch never admitted judged"); ce != nil {
			ce.Write(zap.String("lane", l.name), zap.Int("records", len(batch)), zap.Int("already_processed", len(accept)),
				zap.Int("requeued", len(requeue)))
		}
	}
}

// Close implements runtime.Source: stop polling and close every client,
// which aborts the open (not pre-committed) transaction and releases held
// records at once. Pre-committed transactions stay for the next attempt's
// recovery; Cancel aborts them when the job ends for good. Idempotent.
func (s *Source[T]) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	if s.stopFrontier != nil {
		s.stopFrontier()
		s.fwg.Wait()
	}
	s.stopLanes()
	if s.sib != nil {
		s.sib.leave(s.sibKey, s)
	}
	if s.txn != nil {
		s.txn.Close()
	}
	if s.rq.w != nil {
		s.rq.w.Close()
	}
	if s.ix != nil {
		s.ix.Close()
	}
	if s.admin != nil {
		s.admin.Close()
	}
	return nil
}

// Minimum API versions: ShareGroupHeartbeat v1, and ShareFetch and
// ShareAcknowledge v2, which carry the RENEW acknowledgement (KIP-1222) that
// keeps held records' locks: Apache Kafka 4.2.
var minShareAPIs = []struct {
	key, version int16
}{{76, 1}, {78, 2}, {79, 2}}

// checkShareAPIs fails fast when any broker of the cluster lacks the
// share-group APIs at the versions Weir needs (Apache Kafka 4.2: lock
// renewal), naming each such broker: it asks every broker in the metadata,
// so a mixed cluster (a rolling upgrade in progress) does not pass on the
// answer of whichever broker the client asked first. Such a refusal is
// unrecoverable; a broker that does not answer is a retryable error naming
// it. It says so when a broker advertises an API this client does not know
// (KIP-1289's transactional share acknowledgement, once it exists).
func checkShareAPIs(ctx context.Context, cl *kgo.Client, log *zap.Logger) error {
	vs, err := kadm.NewClient(cl).ApiVersions(ctx)
	if err != nil {
		return fmt.Errorf("brokers unreachable: %w", err)
	}
	var lacking, unreachable []string
	for _, v := range vs.Sorted() {
		if v.Err != nil {
			unreachable = append(unreachable, fmt.Sprintf("broker %d: %v", v.NodeID, v.Err))
			continue
		}
		if why := lacksShareAPIs(v, log); why != "" {
			lacking = append(lacking, fmt.Sprintf("broker %d %s", v.NodeID, why))
		}
	}
	switch {
	case len(lacking) > 0:
		return runtime.Unrecoverable(fmt.Errorf("%w: %s (of %d brokers)", ErrNoShareGroups, strings.Join(lacking, "; "), len(vs)))
	case len(unreachable) > 0:
		return fmt.Errorf("cannot check the share-group APIs of every broker: %s", strings.Join(unreachable, "; "))
	case len(vs) == 0:
		return errors.New("the cluster's metadata lists no broker")
	}
	return nil
}

// lacksShareAPIs says what v's broker lacks of minShareAPIs, or "".
func lacksShareAPIs(v kadm.BrokerApiVersions, log *zap.Logger) string {
	v.EachKeySorted(func(key, _, _ int16) {
		if name := kmsg.NameForKey(key); name == "" && key > 92 {
			log.Info("broker advertises an API this client does not know; if it is KIP-1289's transactional "+
				"share acknowledgement, Weir still uses its ack-log", zap.Int32("broker", v.NodeID), zap.Int16("api_key", key))
		}
	})
	for _, k := range minShareAPIs {
		top, ok := v.KeyMaxVersion(k.key)
		switch {
		case !ok:
			return "lacks " + kmsg.NameForKey(k.key)
		case top < k.version:
			return fmt.Sprintf("has %s up to v%d; v%d (Apache Kafka 4.2, KIP-1222 lock renewal) is needed", kmsg.NameForKey(k.key), top, k.version)
		}
	}
	return ""
}

// CheckBrokers checks that brokers are reachable and support share groups
// at the versions the source needs (Apache Kafka 4.2+), as the source does
// when it opens: a job manager runs it at submit (runtime.JobType.Check),
// so a job that cannot run is refused with a clear error instead of
// restarting. opts add kgo options (TLS, SASL).
func CheckBrokers(ctx context.Context, brokers []string, opts ...kgo.Opt) error {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.DisableClientMetrics()}, opts...)...)
	if err != nil {
		return fmt.Errorf("brokers %v: %w", brokers, err)
	}
	defer cl.Close()
	if err := checkShareAPIs(ctx, cl, zap.NewNop()); err != nil {
		return fmt.Errorf("brokers %s: %w", strings.Join(brokers, ","), err)
	}
	return nil
}

func (s *Source[T]) partitions(ctx context.Context) (int, error) {
	md, err := kadm.NewClient(s.admin).Metadata(ctx, s.cfg.topics...)
	if err != nil {
		return 0, fmt.Errorf("metadata: %w", err)
	}
	n := 0
	for _, t := range s.cfg.topics {
		td, ok := md.Topics[t]
		if !ok || td.Err != nil {
			return 0, fmt.Errorf("input topic %q does not exist: %v", t, td.Err)
		}
		n += len(td.Partitions)
	}
	return n, nil
}

// brokerIntConfig reads an integer broker config (the smallest over the
// brokers), or def when it cannot.
func brokerIntConfig(ctx context.Context, adm *kadm.Client, key string, def int) int {
	rcs, err := adm.DescribeBrokerConfigs(ctx)
	if err != nil {
		return def
	}
	v := 0
	for _, rc := range rcs {
		for _, c := range rc.Configs {
			if c.Key == key && c.Value != nil {
				if n, err := strconv.Atoi(*c.Value); err == nil && (v == 0 || n < v) {
					v = n
				}
			}
		}
	}
	if v == 0 {
		return def
	}
	return v
}

func ensureTopic(ctx context.Context, adm *kadm.Client, topic string, partitions int32) error {
	resp, err := adm.CreateTopic(ctx, partitions, -1, nil, topic)
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("create topic %q: %w", topic, err)
	}
	if resp.Err != nil && !errors.Is(resp.Err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("create topic %q: %w", topic, resp.Err)
	}
	return nil
}

// SetGroupConfig sets a group-level config (IncrementalAlterConfigs, resource
// type GROUP), e.g. share.auto.offset.reset=earliest, which Kafka reads only
// from the group, before the group first reads.
func SetGroupConfig(ctx context.Context, cl *kgo.Client, group, key, value string) error {
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Value = key, kmsg.StringPtr(value)
	res.Configs = append(res.Configs, c)
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("set %s on group %q: %w", key, group, err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return fmt.Errorf("set %s on group %q: %w", key, group, err)
		}
	}
	return nil
}

var _ checkpoint.CancelListener = (*Source[int])(nil)

// collectStamped emits v with its record's Kafka timestamp as its event
// timestamp (a WatermarkStrategy's TimestampAssigner may replace it).
func collectStamped[T any](out runtime.Collector[T], v T, r *kgo.Record) {
	if tc, ok := out.(runtime.TimestampCollector[T]); ok {
		tc.CollectWithTimestamp(v, r.Timestamp.UnixMilli())
		return
	}
	out.Collect(v)
}
