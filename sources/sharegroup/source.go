package sharegroup

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/kafkatxn"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// Failpoints of the source (docs/architecture.md, "Failpoints").
const (
	FailpointAfterAckPrecommit = "source.after-ack-precommit"
	FailpointAfterAckCommit    = "source.after-ack-commit"
)

// Dead-letter headers.
const (
	HeaderError         = "weir.error"
	HeaderDeliveryCount = "weir.delivery.count"
	HeaderTopic         = "weir.source.topic"
	HeaderPartition     = "weir.source.partition"
	HeaderOffset        = "weir.source.offset"
)

// New returns a source factory reading a share group and decoding each
// record with decode. Options are validated here, so a bad job is refused
// when it is built.
func New[T any](decode func(*kgo.Record) (T, error), opts ...Opt) (func() runtime.Source[T], error) {
	c := defaultCfg()
	for _, o := range opts {
		o(&c)
	}
	if err := c.validate(); err != nil {
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
	return func() runtime.Source[T] { return &Source[T]{cfg: c, decode: decode} }, nil
}

// Source is one subtask of a share-group source. Build it with New.
type Source[T any] struct {
	cfg    cfg
	decode func(*kgo.Record) (T, error)
	oc     *runtime.OperatorContext
	log    *zap.Logger

	admin *kgo.Client
	txn   *kafkatxn.TxnWriter // ack markers and dead letters (transactional); dead letters otherwise
	ix    *acklog.Index

	lanes   []*lane
	ready   chan *lane
	limit   int // the broker's group.share.partition.max.record.locks
	lastGC  time.Time
	started bool
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	member  string
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]`)

// Open implements runtime.Source: checks the broker, prepares topics and the
// group, and in transactional mode finishes the restored checkpoint's marker
// transactions (commit) and aborts lingering ones before anything is polled.
func (s *Source[T]) Open(ctx context.Context, oc *runtime.OperatorContext) error {
	s.oc = oc
	s.log = s.cfg.logger
	if s.log == nil {
		s.log = oc.Logger
	}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	s.member = fmt.Sprintf("%s#%d", oc.UID, oc.Subtask)
	base := append([]kgo.Opt{kgo.SeedBrokers(s.cfg.brokers...)}, s.cfg.clientOpts...)
	var err error
	if s.admin, err = kgo.NewClient(base...); err != nil {
		return fmt.Errorf("sharegroup: %w", err)
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
	if s.cfg.maxDeliveries == 0 {
		// One below the broker's limit: the last delivery is ours to
		// dead-letter before the broker archives the record.
		s.cfg.maxDeliveries = int32(max(2, brokerIntConfig(sctx, adm, "group.share.delivery.count.limit", 5)-1))
	}
	if err := ensureTopic(sctx, adm, s.cfg.dlqTopic, 1); err != nil {
		return err
	}
	if s.cfg.resetEarliest {
		if err := SetGroupConfig(sctx, s.admin, s.cfg.group, "share.auto.offset.reset", "earliest"); err != nil {
			return err
		}
	}
	prefix := s.cfg.txnPrefix
	if prefix == "" {
		prefix = unsafeChars.ReplaceAllString("weir-"+oc.Job+"-"+oc.UID, "_")
	}
	wopts := []kafkatxn.Opt{kafkatxn.Brokers(s.cfg.brokers...), kafkatxn.TransactionalIDPrefix(prefix),
		kafkatxn.Subtask(oc.Subtask, oc.Parallelism), kafkatxn.TransactionTimeout(s.cfg.txnTimeout),
		kafkatxn.ClientOpts(s.cfg.clientOpts...), kafkatxn.Logger(s.log)}
	if s.cfg.mode == Transactional {
		if err := acklog.EnsureTopic(sctx, adm, s.cfg.ackLogTopic); err != nil {
			return fmt.Errorf("sharegroup: ack-log: %w", err)
		}
		wopts = append(wopts, kafkatxn.Guarantee(kafkatxn.ExactlyOnce))
	} else {
		wopts = append(wopts, kafkatxn.Guarantee(kafkatxn.AtLeastOnce))
	}
	if s.txn, err = kafkatxn.NewTxnWriter(ctx, wopts...); err != nil {
		return fmt.Errorf("sharegroup: %w", err)
	}
	// Commit the restored checkpoint's marker transactions and abort
	// anything later, before any lane polls: a redelivery must find the
	// recovered markers committed. (Without transactions this only readies
	// the dead-letter writer.)
	if err := s.txn.Recover(ctx, oc.CommitHandles); err != nil {
		return fmt.Errorf("sharegroup: recover ack-marker transactions: %w", err)
	}
	if s.cfg.mode == Transactional {
		if s.ix, err = acklog.NewIndex(ctx, s.cfg.brokers, s.cfg.ackLogTopic, s.cfg.clientOpts...); err != nil {
			return fmt.Errorf("sharegroup: ack-log index: %w", err)
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
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("%s/lane%d", s.member, i)
		cl, err := kgo.NewClient(append(base,
			kgo.ShareGroup(s.cfg.group), kgo.ConsumeTopics(s.cfg.topics...),
			kgo.ShareMaxRecords(int32(s.cfg.batch)), kgo.ShareMaxRecordsStrict(),
			kgo.ConnIdleTimeout(10*time.Minute), kgo.ClientID(name))...)
		if err != nil {
			return fmt.Errorf("sharegroup: lane %d: %w", i, err)
		}
		s.lanes = append(s.lanes, newLane(i, name, cl))
	}
	s.log.Info("share-group source open", zap.String("group", s.cfg.group), zap.Strings("topics", s.cfg.topics),
		zap.Stringer("mode", s.cfg.mode), zap.Int("lanes", n), zap.Int("batch", s.cfg.batch),
		zap.Int("restored_handles", len(oc.CommitHandles)))
	return nil
}

func (s *Source[T]) start() {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	for _, l := range s.lanes {
		s.wg.Add(1)
		go func(l *lane) {
			defer s.wg.Done()
			l.run(ctx, s.cfg.batch, s.ready)
		}(l)
	}
	if !s.cfg.paused {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.renewLoop(ctx)
		}()
	}
	s.started = true
}

// Poll implements runtime.Source: it emits the batches lanes have acquired,
// waiting a little when none is ready.
func (s *Source[T]) Poll(ctx context.Context, out runtime.Collector[T]) error {
	if !s.started {
		s.start()
	}
	if err := s.collectMarkers(ctx); err != nil {
		s.log.Warn("ack-log marker collection failed; retried later", zap.Error(err))
	}
	t := time.NewTimer(s.cfg.pollWait)
	defer t.Stop()
	select {
	case l := <-s.ready:
		if err := s.admit(ctx, l, out); err != nil {
			return err
		}
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	for drained := false; !drained; {
		select {
		case l := <-s.ready:
			if err := s.admit(ctx, l, out); err != nil {
				return err
			}
		default:
			drained = true
		}
	}
	if s.cfg.mode != Implicit && s.oc.RequestCheckpoint != nil {
		if s.allHolding() {
			s.oc.RequestCheckpoint("every share-group lane holds a batch")
		} else if s.nearLimit() {
			s.oc.RequestCheckpoint("held share records near the per-partition cap")
		}
	}
	return nil
}

// collectMarkers tombstones ack markers that can no longer matter: every
// record they cover is below its partition's share start offset (done for
// good), and they are older than the grace period (default 10x the lock
// duration; a tombstoned marker no longer stops a zombie, so the grace
// period bounds how long a paused process can stay one). Subtask 0 does it,
// every tombstoneEvery, outside any transaction.
func (s *Source[T]) collectMarkers(ctx context.Context) error {
	if s.cfg.mode != Transactional || s.oc.Subtask != 0 || time.Since(s.lastGC) < s.cfg.tombstoneEvery {
		return nil
	}
	s.lastGC = time.Now()
	grace := s.cfg.grace
	if grace == 0 {
		lock := 30 * time.Second
		for _, l := range s.lanes {
			l.mu.Lock()
			if l.lockDur > 0 {
				lock = l.lockDur
			}
			l.mu.Unlock()
		}
		grace = 10 * lock
	}
	starts, err := shareStartOffsets(ctx, s.admin, s.cfg.group)
	if err != nil {
		return err
	}
	if err := s.ix.CatchUpToEnd(ctx); err != nil {
		return err
	}
	tombs := s.ix.Tombstones(starts, time.Now(), grace)
	if len(tombs) == 0 {
		return nil
	}
	if err := s.admin.ProduceSync(ctx, tombs...).FirstErr(); err != nil {
		return fmt.Errorf("tombstone %d ack markers: %w", len(tombs), err)
	}
	s.log.Debug("ack markers tombstoned", zap.Int("markers", len(tombs)))
	return nil
}

// shareStartOffsets reads the share-partition start offsets of a group
// (DescribeShareGroupOffsets): below them every record is done.
func shareStartOffsets(ctx context.Context, cl *kgo.Client, group string) (map[acklog.TopicPartition]int64, error) {
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

func (s *Source[T]) allHolding() bool {
	for _, l := range s.lanes {
		l.mu.Lock()
		st := l.state
		l.mu.Unlock()
		if st != laneHolding {
			return false
		}
	}
	return true
}

// admit sorts a lane's fresh batch: already processed (ACCEPT, skip),
// covered by an open marker (set aside), poison or undecodable (dead
// letter, REJECT), lock nearly expired (RELEASE unprocessed), or emitted.
func (s *Source[T]) admit(ctx context.Context, l *lane, out runtime.Collector[T]) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fetchErr != nil {
		s.log.Warn("share fetch error", zap.String("lane", l.name), zap.Error(l.fetchErr))
	}
	batch := l.batch
	l.batch, l.state, l.epoch = nil, laneHolding, 0
	if s.cfg.mode == Transactional {
		for _, r := range batch {
			if r.DeliveryCount() > 1 {
				if err := s.ix.CatchUpToEnd(ctx); err != nil {
					return fmt.Errorf("sharegroup: ack-log: %w", err)
				}
				break
			}
		}
	}
	now := time.Now()
	margin := s.margin(l.lockDur)
	var stale []*kgo.Record
	for _, r := range batch {
		if dl := r.AcquisitionDeadline(); !dl.IsZero() && dl.Sub(now) < margin {
			stale = append(stale, r)
			continue
		}
		if s.cfg.mode == Transactional && r.DeliveryCount() > 1 {
			tp := acklog.TopicPartition{Topic: r.Topic, Partition: r.Partition}
			if e, ok := s.ix.Lookup(tp, r.Offset); ok {
				if e.Status == acklog.Committed {
					l.accepted = append(l.accepted, r)
				} else {
					l.aside = append(l.aside, asideRec{r: r, marker: e.Offset})
				}
				continue
			}
		}
		if r.DeliveryCount() >= s.cfg.maxDeliveries {
			if err := s.deadLetter(ctx, r, fmt.Errorf("delivered %d times (max %d)", r.DeliveryCount(), s.cfg.maxDeliveries)); err != nil {
				return err
			}
			l.rejected = append(l.rejected, r)
			continue
		}
		v, err := s.decode(r)
		if err != nil {
			if err := s.deadLetter(ctx, r, fmt.Errorf("decode: %w", err)); err != nil {
				return err
			}
			l.rejected = append(l.rejected, r)
			continue
		}
		out.Collect(v)
		l.emitted = append(l.emitted, r)
	}
	if len(stale) > 0 {
		s.log.Info("releasing records whose lock was too close to expiry to process", zap.String("lane", l.name), zap.Int("records", len(stale)))
		l.cl.MarkAcks(kgo.AckRelease, stale...)
		if err := l.cl.FlushAcks(ctx); err != nil {
			return fmt.Errorf("sharegroup: release stale records: %w", err)
		}
	}
	if ce := s.log.Check(zap.DebugLevel, "share batch admitted"); ce != nil {
		ce.Write(zap.String("lane", l.name), zap.Int("records", len(batch)), zap.Int("emitted", len(l.emitted)),
			zap.Int("already_processed", len(l.accepted)), zap.Int("set_aside", len(l.aside)),
			zap.Int("rejected", len(l.rejected)), zap.Int("released_stale", len(stale)))
	}
	// A batch with nothing to carry through a checkpoint finishes now:
	// already-processed records are ACCEPTed at once.
	if s.cfg.mode == Implicit || len(l.emitted)+len(l.rejected)+len(l.aside) == 0 {
		return l.finish(ctx, releaseAside)
	}
	l.count()
	return nil
}

func releaseAside(int64) kgo.AckStatus { return kgo.AckRelease }

// deadLetterRecord copies r for the dead-letter topic, with the reason and
// r's origin in headers.
func deadLetterRecord(r *kgo.Record, topic, reason string) *kgo.Record {
	return &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Headers: append(append([]kgo.RecordHeader(nil), r.Headers...),
		kgo.RecordHeader{Key: HeaderError, Value: []byte(reason)},
		kgo.RecordHeader{Key: HeaderDeliveryCount, Value: []byte(strconv.Itoa(int(r.DeliveryCount())))},
		kgo.RecordHeader{Key: HeaderTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: HeaderPartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
		kgo.RecordHeader{Key: HeaderOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))})}
}

// margin is how close to a lock's expiry a record counts as at risk: the
// configured margin, but at most a quarter of the lock duration (a broker
// with short locks would otherwise have every record released as stale).
func (s *Source[T]) margin(lockDur time.Duration) time.Duration {
	if lockDur > 0 && s.cfg.lockMargin > lockDur/4 {
		return lockDur / 4
	}
	return s.cfg.lockMargin
}

// deadLetter copies r to the dead-letter topic, in the current transaction in
// transactional mode.
func (s *Source[T]) deadLetter(ctx context.Context, r *kgo.Record, cause error) error {
	reason := cause.Error()
	if s.oc.RestartCause != "" {
		reason += "; last task failure: " + s.oc.RestartCause
	}
	d := deadLetterRecord(r, s.cfg.dlqTopic, reason)
	s.log.Warn("record sent to the dead-letter topic", zap.String("topic", r.Topic), zap.Int32("partition", r.Partition),
		zap.Int64("offset", r.Offset), zap.String("dlq", s.cfg.dlqTopic), zap.String("reason", reason))
	if err := s.txn.Write(ctx, d); err != nil {
		return fmt.Errorf("sharegroup: dead letter: %w", err)
	}
	return nil
}

// Snapshot implements runtime.Source. Every batch emitted since the last
// barrier belongs to checkpoint id. In transactional mode the source writes
// the epoch's ack marker into the checkpoint's transaction, runs the
// conflict check, and pre-commits; it declines when the epoch may hold
// records another lane processed.
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
			return runtime.OperatorState{}, fmt.Errorf("sharegroup: flush dead letters: %w", err)
		}
		return runtime.OperatorState{}, nil
	}
	now := time.Now()
	offsets := map[acklog.TopicPartition][]int64{}
	for _, l := range epoch {
		l.mu.Lock()
		lapsed := l.lapsed(now, s.margin(l.lockDur))
		l.offsets(offsets)
		l.mu.Unlock()
		if lapsed {
			return runtime.OperatorState{}, fmt.Errorf("%w: %s: the locks of its batch may have expired", checkpoint.ErrDeclined, l.name)
		}
	}
	if len(offsets) > 0 {
		cur, err := s.txn.Current(ctx)
		if err != nil {
			return runtime.OperatorState{}, fmt.Errorf("sharegroup: ack-marker transaction: %w", err)
		}
		m := acklog.Marker{Group: s.cfg.group, Member: s.member, Checkpoint: uint64(id), TransactionalID: cur.TransactionalID,
			ProducerID: cur.ProducerID, Ranges: acklog.RangesOf(offsets), CreatedAt: now}
		rec := m.Record(s.cfg.ackLogTopic)
		if err := s.txn.Write(ctx, rec); err != nil {
			return runtime.OperatorState{}, fmt.Errorf("sharegroup: write ack marker: %w", err)
		}
		if err := s.txn.Flush(ctx); err != nil {
			return runtime.OperatorState{}, fmt.Errorf("sharegroup: flush ack marker: %w", err)
		}
		if err := s.ix.CatchUp(ctx, rec.Offset+1); err != nil {
			return runtime.OperatorState{}, fmt.Errorf("sharegroup: ack-log: %w", err)
		}
		if cs := s.ix.Conflicts(acklog.Entry{Marker: m, Offset: rec.Offset, Status: acklog.Open}); len(cs) > 0 {
			return runtime.OperatorState{}, fmt.Errorf("%w: ack marker at %d overlaps an earlier %s marker at %d (producer %d): "+
				"these records were processed elsewhere (a lock expired)", checkpoint.ErrDeclined, rec.Offset,
				cs[0].Status, cs[0].Offset, cs[0].Marker.ProducerID)
		}
	}
	if _, _, err := s.txn.PreCommit(ctx, id); err != nil {
		return runtime.OperatorState{}, fmt.Errorf("sharegroup: pre-commit: %w", err)
	}
	if err := s.oc.Inject(FailpointAfterAckPrecommit); err != nil {
		return runtime.OperatorState{}, err
	}
	return runtime.OperatorState{Handles: s.txn.Pending()}, nil
}

// NotifyCheckpointComplete implements checkpoint.Listener: commit the marker
// transactions up to id, then ACCEPT (or REJECT) the records they cover.
func (s *Source[T]) NotifyCheckpointComplete(ctx context.Context, id checkpoint.ID) error {
	outcome := releaseAside
	if s.cfg.mode == Transactional {
		if err := s.txn.Commit(ctx, id); err != nil {
			return fmt.Errorf("sharegroup: commit ack markers of checkpoint %d: %w", id, err)
		}
		if err := s.oc.Inject(FailpointAfterAckCommit); err != nil {
			return err
		}
		caught := false
		outcome = func(marker int64) kgo.AckStatus {
			if !caught {
				caught = s.ix.CatchUpToEnd(ctx) == nil
			}
			if e, ok := s.ix.Status(marker); ok && e.Status == acklog.Committed {
				return kgo.AckAccept
			}
			return kgo.AckRelease
		}
	}
	for _, l := range s.lanes {
		l.mu.Lock()
		var err error
		if l.state == laneHolding && l.epoch != 0 && l.epoch <= id {
			err = l.finish(ctx, outcome)
		}
		l.mu.Unlock()
		if err != nil {
			// The commit point passed: a lost ACCEPT only means the
			// records come back and are recognised as processed.
			s.log.Warn("acknowledging a completed epoch failed; its records will be redelivered and skipped",
				zap.String("lane", l.name), zap.Error(err))
		}
	}
	return nil
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
			return fmt.Errorf("sharegroup: abort ack markers of checkpoint %d: %w", id, err)
		}
	}
	for _, l := range s.lanes {
		l.mu.Lock()
		covered := l.state == laneHolding && l.epoch != 0 && l.epoch <= id
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

// renewLoop renews the locks of held batches at a third of the lock
// duration, without polling.
func (s *Source[T]) renewLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for _, l := range s.lanes {
				l.mu.Lock()
				if l.state == laneHolding && l.lockDur > 0 && now.Sub(l.acquiredAt) > l.lockDur/3 {
					if err := l.renew(ctx, now); err != nil {
						s.log.Warn("renewing held records failed", zap.String("lane", l.name), zap.Error(err))
					}
				}
				l.mu.Unlock()
			}
		}
	}
}

// Close implements runtime.Source: stop polling and close every client,
// which releases held records at once.
func (s *Source[T]) Close() error {
	if s.cancel != nil {
		s.cancel()
	}
	for _, l := range s.lanes {
		l.cl.Close()
	}
	s.wg.Wait()
	if s.txn != nil {
		s.txn.Close()
	}
	if s.ix != nil {
		s.ix.Close()
	}
	if s.admin != nil {
		s.admin.Close()
	}
	return nil
}

// checkShareAPIs fails fast when the brokers lack the share-group APIs, and
// says so when they advertise an API this client does not know (KIP-1289's
// transactional share acknowledgement, once it exists).
func checkShareAPIs(ctx context.Context, cl *kgo.Client, log *zap.Logger) error {
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("sharegroup: brokers unreachable: %w", err)
	}
	have := map[int16]bool{}
	for _, k := range resp.ApiKeys {
		have[k.ApiKey] = true
		if name := kmsg.NameForKey(k.ApiKey); name == "" && k.ApiKey > 92 {
			log.Info("broker advertises an API this client does not know; if it is KIP-1289's transactional "+
				"share acknowledgement, Weir still uses its ack-log", zap.Int16("api_key", k.ApiKey))
		}
	}
	for _, k := range []int16{76, 78, 79} { // ShareGroupHeartbeat, ShareFetch, ShareAcknowledge
		if !have[k] {
			return runtime.Unrecoverable(fmt.Errorf("%w: ApiVersions lacks %s", ErrNoShareGroups, kmsg.NameForKey(k)))
		}
	}
	return nil
}

func (s *Source[T]) partitions(ctx context.Context) (int, error) {
	md, err := kadm.NewClient(s.admin).Metadata(ctx, s.cfg.topics...)
	if err != nil {
		return 0, fmt.Errorf("sharegroup: metadata: %w", err)
	}
	n := 0
	for _, t := range s.cfg.topics {
		td, ok := md.Topics[t]
		if !ok || td.Err != nil {
			return 0, fmt.Errorf("sharegroup: input topic %q does not exist: %v", t, td.Err)
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
		return fmt.Errorf("sharegroup: create topic %q: %w", topic, err)
	}
	if resp.Err != nil && !errors.Is(resp.Err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("sharegroup: create topic %q: %w", topic, resp.Err)
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
		return fmt.Errorf("sharegroup: set %s on group %q: %w", key, group, err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return fmt.Errorf("sharegroup: set %s on group %q: %w", key, group, err)
		}
	}
	return nil
}
