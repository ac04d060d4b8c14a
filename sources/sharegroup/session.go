package sharegroup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/deadletter"
	"github.com/weirstream/weir/internal/kafkatxn"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// Errors of a Session, matchable with errors.Is.
var (
	// ErrConflict is wrapped by Commit's error when the batch holds records
	// that another transaction processed (or may have processed): an
	// earlier ack marker of another producer that overlaps the batch
	// committed, stayed open past every bound, or the session's own clock
	// says its locks may have lapsed. The session's transaction was aborted
	// (nothing of it becomes visible) and its records were released.
	// Retry with a new Poll: records already processed elsewhere are then
	// recognised and skipped. Use errors.As with *ConflictError for details.
	ErrConflict = errors.New("session: records of the batch were processed by another transaction")
	// ErrAborted is wrapped by Commit's error when the session's
	// transaction was aborted: none of its outputs, dead letters or its ack
	// marker ever become visible, and its records were released for
	// redelivery. ErrConflict errors wrap it too.
	ErrAborted = errors.New("session: transaction aborted")
	// ErrOutcomeUnknown is wrapped by Commit's error when the commit request
	// failed and the session could not learn whether the transaction
	// committed. Its records were released: if it did commit, their
	// redelivery is recognised through the ack marker and not processed
	// again; if it did not, they are processed again. Exactly once holds
	// either way; only the caller does not know which one happened.
	ErrOutcomeUnknown = errors.New("session: transaction outcome unknown")
	// ErrBatchOpen is returned by Poll while the previous batch is neither
	// committed nor aborted: polling again would make the client accept it.
	ErrBatchOpen = errors.New("session: the polled batch is still open; Commit or Abort it first")
	// ErrNotInBatch is returned by Reject for a record that is not one of
	// the open batch's records.
	ErrNotInBatch = errors.New("session: record is not in the open batch")
	// ErrSessionClosed is returned by every method after Close.
	ErrSessionClosed = errors.New("session closed")
)

// ConflictError details an ErrConflict. It unwraps to ErrConflict and
// ErrAborted.
type ConflictError struct {
	// Marker is the ack-log offset of the session's own marker, or -1 if
	// the session declined before writing it.
	Marker int64
	// Earlier is the earlier overlapping marker that won (committed), or
	// stayed open (Unresolved). Zero when Lapsed.
	Earlier acklog.Entry
	// Lapsed is set when the session's own clock says the batch's locks may
	// have expired (no successful renewal within the lock duration minus
	// the margin), or the broker refused a renewal.
	Lapsed bool
	// Unresolved is set when Earlier was still open after the wait bound
	// and an attempt to abort it.
	Unresolved bool
}

// Error implements error.
func (e *ConflictError) Error() string {
	switch {
	case e.Lapsed:
		return "session: conflict: the batch's record locks may have expired (no successful renewal in time); aborted"
	case e.Unresolved:
		return fmt.Sprintf("session: conflict: ack marker at %d overlaps the earlier marker at %d (producer %d, %q) "+
			"which stayed open past the wait bound and could not be aborted; aborted",
			e.Marker, e.Earlier.Offset, e.Earlier.Marker.ProducerID, e.Earlier.Marker.TransactionalID)
	}
	return fmt.Sprintf("session: conflict: ack marker at %d overlaps the earlier %s marker at %d (producer %d, %q): "+
		"these records were processed there (a lock expired); aborted",
		e.Marker, e.Earlier.Status, e.Earlier.Offset, e.Earlier.Marker.ProducerID, e.Earlier.Marker.TransactionalID)
}

// Unwrap returns ErrConflict and ErrAborted.
func (e *ConflictError) Unwrap() []error { return []error{ErrConflict, ErrAborted} }

// sessAside is a redelivered record covered by a still-open ack marker.
type sessAside struct {
	r      *kgo.Record
	marker int64
}

// sessBatch is what one Poll acquired and the session holds.
type sessBatch struct {
	recs      []*kgo.Record            // returned; in the marker
	in        map[*kgo.Record]struct{} // recs as a set
	reject    map[*kgo.Record]struct{} // subset of recs to REJECT
	aside     []sessAside              // not returned; resolved by their marker
	clock     lockClock                // of the batch's locks, by our clock
	renewedAt time.Time                // last renewal attempt (or the poll)
}

func (b *sessBatch) held() []*kgo.Record {
	out := slices.Clone(b.recs)
	for _, a := range b.aside {
		out = append(out, a.r)
	}
	return out
}

// sessPoint names a place in Commit where tests may interrupt it.
type sessPoint int

const (
	sessAfterMarker sessPoint = iota // outputs and marker flushed, conflict check passed, before EndTxn
	sessAfterCommit                  // EndTxn committed, before the ACCEPT
)

// errSessCrashed is returned by Commit when a test hook crashed the session.
var errSessCrashed = errors.New("session crashed (test hook)")

// Session is a transactional share-group session for plain Go programs:
// poll a batch of records from a share group, produce outputs into a Kafka
// transaction, and Commit, which makes the outputs visible and acknowledges
// (ACCEPTs) the records as one outcome. It is Weir's stand-in for KIP-1289
// (transactional acknowledgements for share groups) without the framework:
// Commit writes an ack marker naming the batch's offsets into the same
// transaction, on the group's one-partition ack-log, and applies the
// conflict rule (the first committed marker in log order wins) before it
// commits.
//
// The loop:
//
//	for {
//		recs, err := s.Poll(ctx)  // a batch; nil error means one is open
//		if err != nil { ... }
//		for _, r := range recs {
//			s.Produce(ctx, transform(r))
//		}
//		if err := s.Commit(ctx); errors.Is(err, sharegroup.ErrConflict) {
//			continue // someone else processed them; nothing of ours is visible
//		}
//	}
//
// Guarantee: each record of the group is processed by at most one
// committed transaction, and a record is ACCEPTed only after the
// transaction that processed it committed. A crash anywhere leaves either
// the outputs and the marker committed (the redelivered records are then
// recognised and ACCEPTed without being returned) or neither (the records
// are processed again).
//
// Methods are safe for concurrent use but run one at a time; a background
// goroutine renews the locks of the open batch.
type Session struct {
	cfg    cfg
	log    *zap.Logger
	admin  *kgo.Client // metadata, configs, raw transaction requests
	adm    *kadm.Client
	cons   *kgo.Client // the share consumer
	ix     *acklog.Index
	ctx    context.Context // background work; cancelled by Close
	cancel context.CancelFunc

	opMu   sync.Mutex // serialises the public methods
	prod   *kgo.Client
	inTxn  bool
	seq    uint64
	closed bool

	pmu  sync.Mutex
	perr error // first failed produce of the open transaction

	ack *acker // serialises acknowledgements (renewer vs. methods) and sees refusals

	mu    sync.Mutex // guards batch
	batch *sessBatch

	wake chan struct{}
	wg   sync.WaitGroup

	lastCheck time.Time // of the group's isolation level, by Poll

	// Tests only, set before use.
	hook         func(sessPoint) (crash bool)
	noLapseCheck bool
}

// NewSession validates the options, checks that the brokers speak share
// groups (else an error wrapping ErrNoShareGroups) and that the input topics
// exist, creates the ack-log when missing, sets share.isolation.level=
// read_committed on the group and reads it back (else an error wrapping
// ErrReadUncommitted), sets share.auto.offset.reset on the group (unless
// StartFromLatest), initialises the transactional
// producer (which aborts a transaction its transactional id left open) and
// joins the share group.
func NewSession(ctx context.Context, opts ...Opt) (*Session, error) {
	c := sessionDefaults()
	for _, o := range opts {
		o.apply(&c)
	}
	if err := c.validateSession(); err != nil {
		return nil, err
	}
	if c.ackLogTopic == "" {
		c.ackLogTopic = acklog.TopicFor(c.group)
	}
	if c.txnID == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		c.txnID = "weir-session-" + hex.EncodeToString(b[:])
	}
	if c.logger == nil {
		c.logger = zap.NewNop()
	}
	s := &Session{cfg: c, log: c.logger.With(zap.String("session", c.txnID)), wake: make(chan struct{}, 1), ack: &acker{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	ok := false
	defer func() {
		if !ok {
			s.cancel()
			s.closeClients()
		}
	}()

	var err error
	if s.admin, err = kgo.NewClient(s.baseOpts()...); err != nil {
		return nil, fmt.Errorf("%w: session: kafka client: %w", ErrInvalidConfig, err)
	}
	s.adm = kadm.NewClient(s.admin)
	if err := checkShareAPIs(ctx, s.admin, s.log); err != nil {
		return nil, err
	}
	if err := s.checkTopics(ctx); err != nil {
		return nil, err
	}
	if err := acklog.EnsureTopic(ctx, s.adm, c.ackLogTopic); err != nil {
		return nil, fmt.Errorf("session: ack-log: %w", err)
	}
	warnShortDeleteRetention(ctx, s.log, s.adm, c.ackLogTopic)
	if err := prepareGroup(ctx, s.admin, s.cfg.group, c.resetEarliest); err != nil {
		return nil, err
	}
	s.lastCheck = time.Now()
	if s.ix, err = acklog.NewIndex(ctx, c.brokers, c.ackLogTopic, c.clientOpts...); err != nil {
		return nil, fmt.Errorf("session: ack-log index: %w", err)
	}
	if _, err := s.producer(ctx); err != nil {
		return nil, err
	}
	s.cons, err = kgo.NewClient(append(s.baseOpts(),
		kgo.ShareGroup(c.group),
		kgo.ConsumeTopics(c.topics...),
		kgo.ShareMaxRecords(int32(c.batch)),
		kgo.ShareMaxRecordsStrict(), // fetch only when polled: no stale prefetch
		kgo.ShareAckCallback(s.ack.callback),
		kgo.ConnIdleTimeout(10*time.Minute), // an idle connection may drop held records
		kgo.ClientID(c.txnID),
	)...)
	if err != nil {
		return nil, fmt.Errorf("%w: session: share consumer: %w", ErrInvalidConfig, err)
	}
	s.ack.cl = s.cons
	s.wg.Add(1)
	go s.renewLoop()
	ok = true
	s.log.Info("share-group session open", zap.String("group", c.group), zap.Strings("topics", c.topics),
		zap.String("ack_log", c.ackLogTopic))
	return s, nil
}

// TransactionalID returns the transactional.id of the session's producer.
func (s *Session) TransactionalID() string { return s.cfg.txnID }

func (s *Session) baseOpts() []kgo.Opt {
	return append(slices.Clone(s.cfg.clientOpts), kgo.SeedBrokers(s.cfg.brokers...), kgo.DisableClientMetrics())
}

// producer returns the transactional producer, making and initialising it
// if needed (InitProducerID aborts a transaction left open by the id).
func (s *Session) producer(ctx context.Context) (*kgo.Client, error) {
	if s.prod != nil {
		return s.prod, nil
	}
	cl, err := kgo.NewClient(append(s.baseOpts(),
		kgo.TransactionalID(s.cfg.txnID),
		kgo.TransactionTimeout(s.cfg.txnTimeout),
	)...)
	if err != nil {
		return nil, fmt.Errorf("%w: session: producer: %w", ErrInvalidConfig, err)
	}
	if _, _, err := cl.ProducerID(ctx); err != nil {
		cl.Close()
		return nil, fmt.Errorf("session: init producer %q: %w", s.cfg.txnID, err)
	}
	s.prod = cl
	return cl, nil
}

// dropProducer closes the producer; the next one re-initialises the id,
// which aborts whatever transaction of ours is still open.
func (s *Session) dropProducer() {
	if s.prod != nil {
		s.prod.Close()
		s.prod = nil
	}
	s.inTxn = false
}

func (s *Session) onProduced(r *kgo.Record, err error) {
	if err == nil {
		return
	}
	s.pmu.Lock()
	if s.perr == nil {
		s.perr = fmt.Errorf("session: produce to %s[%d]: %w", r.Topic, r.Partition, err)
	}
	s.pmu.Unlock()
}

func (s *Session) produceErr() error {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	return s.perr
}

// detached returns a context that outlives ctx's cancellation, bounded by d:
// for steps whose interruption would leave an unknown state (EndTxn, acks).
func detached(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}

// Poll acquires a batch of records and returns those to process. A nil
// error means a batch is open, even if no record is returned: Commit or
// Abort it before polling again (else ErrBatchOpen). It blocks until
// records arrive or ctx is done (then it returns ctx's error and no batch).
//
// Every record (whatever its delivery count) is looked up in the ack-log,
// caught up to its end: covered by a committed marker, they were processed
// and their outputs committed, so they are ACCEPTed and not returned;
// covered by a still-open marker, they are set aside (held, not returned)
// and resolved by Commit or Abort: ACCEPTed if that marker committed,
// RELEASEd otherwise (Commit first waits for the marker, as for a conflict).
// Records whose lock has less than the lock margin left are RELEASEd
// unprocessed.
//
// Every few seconds Poll also checks that the group's share.isolation.level
// is still read_committed; if not, it returns an error wrapping
// ErrReadUncommitted and no batch.
func (s *Session) Poll(ctx context.Context) ([]*kgo.Record, error) {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	if s.closed {
		return nil, ErrSessionClosed
	}
	s.mu.Lock()
	open := s.batch != nil
	s.mu.Unlock()
	if open {
		return nil, ErrBatchOpen
	}
	if time.Since(s.lastCheck) >= s.cfg.checkEvery {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := checkIsolation(cctx, s.admin, s.cfg.group)
		cancel()
		switch {
		case errors.Is(err, ErrReadUncommitted):
			return nil, fmt.Errorf("%w (changed while the session ran: records of open or aborted transactions "+
				"may have been returned since the last check)", err)
		case err != nil:
			s.log.Warn("share group isolation level check failed; retried later", zap.Error(err))
		}
		s.lastCheck = time.Now()
	}
	for {
		fs := s.cons.PollRecords(ctx, s.cfg.batch)
		if fs.IsClientClosed() {
			return nil, ErrSessionClosed
		}
		var recs []*kgo.Record
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if ferr == nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				ferr = fmt.Errorf("session: fetch %s[%d]: %w", t, p, err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
		if len(recs) == 0 {
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("session: poll: %w", err)
			}
			if ferr != nil {
				return nil, ferr
			}
			continue
		}
		if ferr != nil {
			s.log.Warn("share fetch error", zap.Error(ferr))
		}
		b, err := s.admit(ctx, recs)
		if err != nil {
			return nil, err
		}
		if len(b.recs) == 0 && len(b.aside) == 0 {
			continue // everything was already processed or released
		}
		s.mu.Lock()
		s.batch = b
		s.mu.Unlock()
		select {
		case s.wake <- struct{}{}:
		default:
		}
		return slices.Clone(b.recs), nil
	}
}

// admit sorts a fresh batch: already processed (ACCEPT now), covered by an
// open marker (set aside), lock nearly expired (RELEASE now), or returned.
func (s *Session) admit(ctx context.Context, recs []*kgo.Record) (*sessBatch, error) {
	now := time.Now()
	b := &sessBatch{in: make(map[*kgo.Record]struct{}), reject: make(map[*kgo.Record]struct{}), renewedAt: now,
		clock: newLockClock(recs, now)}
	margin := lockMargin(s.cfg.lockMargin, b.clock.dur)
	// Every record is looked up, whatever its delivery count: a share
	// partition whose state was lost or reset redelivers committed records
	// at count 1.
	if err := s.ix.CatchUpToEnd(ctx); err != nil {
		s.ackNow(ctx, kgo.AckRelease, recs)
		return nil, fmt.Errorf("session: ack-log: %w", err)
	}
	var accept, release []*kgo.Record
	for _, r := range recs {
		tp := acklog.TopicPartition{Topic: r.Topic, Partition: r.Partition}
		if e, ok := s.ix.Lookup(tp, r.Offset); ok {
			if e.Status == acklog.Committed {
				accept = append(accept, r)
			} else {
				b.aside = append(b.aside, sessAside{r: r, marker: e.Offset})
			}
			continue
		}
		// Only a record to be returned is released for its lock (as the
		// source's judge): a release costs a delivery.
		if b.clock.expiresSoon(r, now, margin) {
			release = append(release, r)
			continue
		}
		b.recs = append(b.recs, r)
		b.in[r] = struct{}{}
	}
	if len(release) > 0 {
		s.log.Info("releasing records whose lock was too close to expiry to process", zap.Int("records", len(release)))
		s.ackNow(ctx, kgo.AckRelease, release)
	}
	if len(accept) > 0 {
		s.log.Debug("accepting redelivered records already processed by a committed transaction", zap.Int("records", len(accept)))
		s.ackNow(ctx, kgo.AckAccept, accept)
	}
	return b, nil
}

// ackNow acknowledges records at once. A failure only means they come
// back: they are then judged again.
func (s *Session) ackNow(ctx context.Context, st kgo.AckStatus, recs []*kgo.Record) {
	fctx, cancel := detached(ctx, 10*time.Second)
	defer cancel()
	if refused, err := s.ack.ack(fctx, st, recs...); err != nil || len(refused) > 0 {
		s.log.Warn("acknowledging records failed; they will be redelivered", zap.Stringer("ack", st),
			zap.Error(errors.Join(err, refusedErr(refused))))
	}
}

// Produce produces r asynchronously into the session's transaction,
// beginning one if none is open. A failed produce is returned by the next
// Produce and makes Commit abort. As in kgo, ctx bounds the wait for buffer
// space and a record whose ctx is cancelled before it is sent fails: keep
// ctx alive until Commit.
func (s *Session) Produce(ctx context.Context, r *kgo.Record) error {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	if s.closed {
		return ErrSessionClosed
	}
	return s.produce(ctx, r)
}

func (s *Session) produce(ctx context.Context, r *kgo.Record) error {
	if err := s.produceErr(); err != nil {
		return err
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	s.prod.Produce(ctx, r, s.onProduced)
	return nil
}

func (s *Session) begin(ctx context.Context) error {
	if s.inTxn {
		return nil
	}
	cl, err := s.producer(ctx)
	if err != nil {
		return err
	}
	if err := cl.BeginTransaction(); err != nil {
		s.dropProducer()
		return fmt.Errorf("session: begin transaction: %w", err)
	}
	s.pmu.Lock()
	s.perr = nil
	s.pmu.Unlock()
	s.inTxn = true
	return nil
}

// Reject marks r, a record of the open batch, as poison: Commit REJECTs it
// (the broker archives it, never to redeliver it) instead of ACCEPTing it,
// in the same outcome as the transaction. If dlqTopic is not empty, r is
// copied there inside the transaction, with the headers weir.error (reason),
// weir.delivery.count, weir.source.topic, weir.source.partition and
// weir.source.offset. Abort forgets the mark.
func (s *Session) Reject(ctx context.Context, r *kgo.Record, reason error, dlqTopic string) error {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	if s.closed {
		return ErrSessionClosed
	}
	s.mu.Lock()
	b := s.batch
	var ok bool
	if b != nil {
		_, ok = b.in[r]
	}
	s.mu.Unlock()
	if !ok {
		return ErrNotInBatch
	}
	if dlqTopic != "" {
		why := "rejected"
		if reason != nil {
			why = reason.Error()
		}
		d := deadletter.Record(r, dlqTopic, why)
		if err := s.produce(ctx, d); err != nil {
			return err
		}
	}
	s.mu.Lock()
	b.reject[r] = struct{}{}
	s.mu.Unlock()
	return nil
}

// Commit ends the session's transaction and batch as one outcome:
//
//  1. If the batch's locks may have lapsed by the session's own clock
//     (or the broker refused a renewal), it aborts (ErrConflict).
//  2. It waits for the markers of records Poll set aside (bounded, see
//     OpenMarkerWait).
//  3. It flushes the outputs, then produces the ack marker for the batch's
//     records into the same transaction and flushes it.
//  4. Conflict check: it reads the ack-log up to its marker; an earlier
//     marker of another producer overlapping the batch that committed
//     means these records were processed there: it aborts its own
//     transaction and returns an error wrapping ErrConflict. An earlier
//     one still open is waited for (renewing the locks), up to the
//     open-marker wait; then that stale transaction is aborted and the
//     check repeated.
//  5. It commits the transaction (EndTxn), then ACCEPTs the records (and
//     REJECTs those marked with Reject).
//
// On nil the outputs are visible (read_committed) and the records
// acknowledged. On an error wrapping ErrAborted (ErrConflict included)
// nothing of the transaction becomes visible and the records were
// released; on ErrOutcomeUnknown see there. Either way the batch is closed
// and Poll may be called again. Without a batch Commit just commits what
// was produced; with nothing at all it does nothing.
func (s *Session) Commit(ctx context.Context) error {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	if s.closed {
		return ErrSessionClosed
	}
	s.mu.Lock()
	b := s.batch
	s.mu.Unlock()
	if b == nil && !s.inTxn {
		return nil
	}
	if b != nil && len(b.recs) > 0 && s.lapsed(b) {
		return s.fail(ctx, b, &ConflictError{Marker: -1, Lapsed: true})
	}
	if b != nil && len(b.aside) > 0 {
		if err := s.awaitAside(ctx, b); err != nil {
			return s.fail(ctx, b, err)
		}
	}
	var own acklog.Entry
	hasMarker := b != nil && len(b.recs) > 0
	if s.inTxn {
		if err := s.prod.Flush(ctx); err != nil {
			return s.fail(ctx, b, fmt.Errorf("%w: flush outputs: %w", ErrAborted, err))
		}
		if err := s.produceErr(); err != nil {
			return s.fail(ctx, b, fmt.Errorf("%w: %w", ErrAborted, err))
		}
	}
	if hasMarker {
		var err error
		if own, err = s.writeMarker(ctx, b); err != nil {
			return s.fail(ctx, b, fmt.Errorf("%w: %w", ErrAborted, err))
		}
		if err := s.checkConflicts(ctx, own); err != nil {
			return s.fail(ctx, b, err)
		}
		// The waits may have outlasted a lock whose renewal failed.
		if s.lapsed(b) {
			return s.fail(ctx, b, &ConflictError{Marker: own.Offset, Lapsed: true})
		}
	}
	if s.crashAt(sessAfterMarker) {
		return errSessCrashed
	}
	if s.inTxn {
		if err := s.commitTxn(ctx, own, hasMarker); err != nil {
			return s.fail(ctx, b, err)
		}
	}
	if s.crashAt(sessAfterCommit) {
		return errSessCrashed
	}
	if b != nil {
		ok := true
		if hasMarker {
			ok = s.markerCommitted(ctx, own.Offset)
		}
		s.finish(ctx, b, ok)
	}
	return nil
}

// lapsed reports whether the batch's locks may have expired.
func (s *Session) lapsed(b *sessBatch) bool {
	if s.noLapseCheck {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return b.clock.lapsed(time.Now(), lockMargin(s.cfg.lockMargin, b.clock.dur)) != nil
}

// writeMarker produces the batch's ack marker into the open transaction
// and returns it as an Open entry at its ack-log offset.
func (s *Session) writeMarker(ctx context.Context, b *sessBatch) (acklog.Entry, error) {
	if err := s.begin(ctx); err != nil {
		return acklog.Entry{}, err
	}
	pid, _, err := s.prod.ProducerID(ctx)
	if err != nil {
		return acklog.Entry{}, fmt.Errorf("producer id: %w", err)
	}
	offsets := make(map[acklog.TopicPartition][]int64)
	for _, r := range b.recs {
		tp := acklog.TopicPartition{Topic: r.Topic, Partition: r.Partition}
		offsets[tp] = append(offsets[tp], r.Offset)
	}
	s.seq++
	m := acklog.Marker{
		Group:           s.cfg.group,
		Member:          s.cfg.txnID,
		Checkpoint:      s.seq,
		TransactionalID: s.cfg.txnID,
		ProducerID:      pid,
		Ranges:          acklog.RangesOf(offsets),
		CreatedAt:       time.Now(),
	}
	rec := m.Record(s.cfg.ackLogTopic)
	if err := s.prod.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return acklog.Entry{}, fmt.Errorf("write ack marker: %w", err)
	}
	return acklog.Entry{Marker: m, Offset: rec.Offset, Status: acklog.Open}, nil
}

// checkConflicts runs the conflict check for the session's marker own.
func (s *Session) checkConflicts(ctx context.Context, own acklog.Entry) error {
	if err := s.ix.CatchUp(ctx, own.Offset+1); err != nil {
		return fmt.Errorf("%w: ack-log: %w", ErrAborted, err)
	}
	var winner *acklog.Entry
	unresolved, err := s.await(ctx, func() ([]acklog.Entry, bool) {
		var open []acklog.Entry
		for _, c := range s.ix.Conflicts(own) {
			if c.Status == acklog.Committed {
				winner = &c
				return nil, true
			}
			open = append(open, c)
		}
		return open, false
	})
	switch {
	case err != nil:
		return fmt.Errorf("%w: conflict check: %w", ErrAborted, err)
	case winner != nil:
		return &ConflictError{Marker: own.Offset, Earlier: *winner}
	case len(unresolved) > 0:
		return &ConflictError{Marker: own.Offset, Earlier: unresolved[0], Unresolved: true}
	}
	return nil
}

// awaitAside waits for the open markers covering set-aside records. A
// marker that stays open is aborted; one that cannot be is left to Commit's
// outcome (its records are released).
func (s *Session) awaitAside(ctx context.Context, b *sessBatch) error {
	_, err := s.await(ctx, func() ([]acklog.Entry, bool) {
		var open []acklog.Entry
		seen := make(map[int64]bool)
		for _, a := range b.aside {
			if e, ok := s.ix.Status(a.marker); ok && e.Status == acklog.Open && !seen[a.marker] {
				seen[a.marker] = true
				open = append(open, e)
			}
		}
		return open, false
	})
	if err != nil {
		return fmt.Errorf("%w: waiting for the markers of set-aside records: %w", ErrAborted, err)
	}
	return nil
}

// await catches the index up and calls pending until it reports nothing
// open or stop. After the open-marker wait it aborts the transactions of
// the markers still open, and waits as long again for the index to see
// it; what is still open then is returned.
func (s *Session) await(ctx context.Context, pending func() (open []acklog.Entry, stop bool)) ([]acklog.Entry, error) {
	deadline := time.Now().Add(s.cfg.openWait)
	aborted, logged := false, false
	backoff := 10 * time.Millisecond
	for {
		open, stop := pending()
		if stop || len(open) == 0 {
			return nil, nil
		}
		if !logged {
			logged = true
			s.log.Info("waiting for an earlier ack marker's transaction to end", zap.Int64("marker", open[0].Offset),
				zap.String("txn", open[0].Marker.TransactionalID), zap.Int("open_markers", len(open)),
				zap.Duration("bound", s.cfg.openWait))
		}
		if time.Now().After(deadline) {
			if aborted {
				return open, nil
			}
			for _, e := range open {
				s.abortStale(ctx, e)
			}
			aborted = true
			deadline = time.Now().Add(max(s.cfg.openWait, time.Second))
		} else {
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			case <-t.C:
			}
			backoff = min(2*backoff, 200*time.Millisecond)
		}
		if err := s.ix.CatchUpToEnd(ctx); err != nil {
			return nil, err
		}
	}
}

// abortStale aborts the transaction of an open marker that outstayed the
// wait (abortStaleMarker).
func (s *Session) abortStale(ctx context.Context, e acklog.Entry) {
	abortStaleMarker(ctx, s.admin, e, s.cfg.openWait, s.log)
}

// commitTxn commits the open transaction with a raw EndTxn carrying the
// producer's id and epoch (kgo's EndTransaction may turn a commit into an
// abort on its own), then brings the kgo client up to date. On failure
// the transaction is settled (the producer is re-initialised, which aborts
// it if still open) and the error says what became of it.
func (s *Session) commitTxn(ctx context.Context, own acklog.Entry, hasMarker bool) error {
	dctx, cancel := detached(ctx, 30*time.Second)
	defer cancel()
	pid, epoch, err := s.prod.ProducerID(dctx)
	if err == nil {
		err = kafkatxn.EndTxn(dctx, s.admin, checkpoint.TxnHandle{TransactionalID: s.cfg.txnID, ProducerID: pid, Epoch: epoch}, true)
	}
	if err == nil {
		s.syncProducer(dctx, pid, epoch, kgo.TryCommit)
		return nil
	}
	known := errors.Is(err, kerr.InvalidTxnState) || errors.Is(err, kerr.ProducerFenced) ||
		errors.Is(err, kerr.InvalidProducerEpoch) || errors.Is(err, kerr.InvalidProducerIDMapping)
	s.dropProducer()
	_, perr := s.producer(dctx) // settles the transaction: aborts it if still open
	if hasMarker {
		if e, ok := s.markerStatus(dctx, own.Offset); ok {
			switch e.Status {
			case acklog.Committed:
				s.log.Warn("commit request failed but the transaction committed", zap.Error(err))
				return nil
			case acklog.Aborted:
				return fmt.Errorf("%w: commit: %w", ErrAborted, err)
			}
		}
	}
	if known && perr == nil {
		return fmt.Errorf("%w: commit: %w", ErrAborted, err)
	}
	return fmt.Errorf("%w: commit: %w", ErrOutcomeUnknown, errors.Join(err, perr))
}

// syncProducer repeats the end through kgo after a raw EndTxn, which the
// broker answers as a retry; if the client did not move past the ended
// epoch, it is replaced.
func (s *Session) syncProducer(ctx context.Context, pid int64, epoch int16, how kgo.TransactionEndTry) {
	s.inTxn = false
	if err := s.prod.EndTransaction(ctx, how); err == nil {
		if p, e, err := s.prod.ProducerID(ctx); err == nil && (p != pid || e > epoch) {
			return
		}
	}
	s.log.Debug("replacing the producer after EndTxn")
	s.dropProducer()
}

// abortTxn aborts the open transaction; if kgo cannot, the producer is
// dropped, and re-initialising its id aborts the transaction.
func (s *Session) abortTxn(ctx context.Context) {
	if !s.inTxn {
		return
	}
	dctx, cancel := detached(ctx, 30*time.Second)
	defer cancel()
	err := s.prod.AbortBufferedRecords(dctx)
	if err == nil {
		err = s.prod.EndTransaction(dctx, kgo.TryAbort)
	}
	s.inTxn = false
	if err != nil {
		s.log.Info("abort through the client failed; re-initialising the producer aborts the transaction", zap.Error(err))
		s.dropProducer()
		if _, err := s.producer(dctx); err != nil {
			s.log.Warn("re-initialising the producer failed; the transaction stays open until its timeout, "+
				"then aborts (it can never commit)", zap.Error(err))
		}
	}
	s.pmu.Lock()
	s.perr = nil
	s.pmu.Unlock()
}

// fail aborts the transaction, releases the batch and returns cause.
func (s *Session) fail(ctx context.Context, b *sessBatch, cause error) error {
	s.abortTxn(ctx)
	if b != nil {
		s.finish(ctx, b, false)
	}
	var ce *ConflictError
	if errors.As(cause, &ce) {
		s.log.Warn("commit declined", zap.Error(cause))
	}
	return cause
}

// markerStatus catches the index up and returns the status of the marker
// at offset.
func (s *Session) markerStatus(ctx context.Context, offset int64) (acklog.Entry, bool) {
	if err := s.ix.CatchUpToEnd(ctx); err != nil {
		s.log.Warn("reading the ack-log failed", zap.Error(err))
		return acklog.Entry{}, false
	}
	return s.ix.Status(offset)
}

// markerCommitted double-checks, before ACCEPTing, that the marker
// committed. If that cannot be confirmed the records are released instead:
// redelivered, they are judged by the marker.
func (s *Session) markerCommitted(ctx context.Context, offset int64) bool {
	dctx, cancel := detached(ctx, 10*time.Second)
	defer cancel()
	e, ok := s.markerStatus(dctx, offset)
	if ok && e.Status == acklog.Committed {
		return true
	}
	s.log.Error("committed transaction's ack marker is not seen committed; releasing its records instead of accepting them",
		zap.Int64("marker", offset), zap.Bool("found", ok), zap.Stringer("status", e.Status))
	return false
}

// finish acknowledges and closes the batch: on success ACCEPT (REJECT the
// rejected), otherwise RELEASE; set-aside records by their marker's
// outcome.
func (s *Session) finish(ctx context.Context, b *sessBatch, success bool) {
	dctx, cancel := detached(ctx, 10*time.Second)
	defer cancel()
	var asideSt map[int64]kgo.AckStatus
	if len(b.aside) > 0 {
		asideSt = make(map[int64]kgo.AckStatus)
		if err := s.ix.CatchUpToEnd(dctx); err != nil {
			s.log.Warn("reading the ack-log failed; releasing set-aside records", zap.Error(err))
		}
		for _, a := range b.aside {
			st := kgo.AckRelease
			if e, ok := s.ix.Status(a.marker); ok && e.Status == acklog.Committed {
				st = kgo.AckAccept
			}
			asideSt[a.marker] = st
		}
	}
	s.ack.mu.Lock()
	s.mu.Lock()
	var accept, reject []*kgo.Record
	for _, r := range b.recs {
		if b.clock.isLost(r) {
			continue // no longer ours: never ACCEPTed by us
		}
		if _, rej := b.reject[r]; rej {
			reject = append(reject, r)
		} else {
			accept = append(accept, r)
		}
	}
	s.mu.Unlock()
	if success {
		if len(accept) > 0 {
			s.cons.MarkAcks(kgo.AckAccept, accept...)
		}
		if len(reject) > 0 {
			s.cons.MarkAcks(kgo.AckReject, reject...)
		}
	} else if len(b.recs) > 0 {
		s.cons.MarkAcks(kgo.AckRelease, b.recs...)
	}
	for _, a := range b.aside {
		s.cons.MarkAcks(asideSt[a.marker], a.r)
	}
	refused, err := s.ack.ackLocked(dctx, 0)
	s.ack.mu.Unlock()
	if err != nil || len(refused) > 0 {
		s.log.Warn("acknowledging the batch failed; its records will be redelivered and judged by the ack-log",
			zap.Bool("committed", success), zap.Error(errors.Join(err, refusedErr(refused))))
	}
	s.mu.Lock()
	if s.batch == b {
		s.batch = nil
	}
	s.mu.Unlock()
}

// Abort aborts the session's transaction (none of its outputs becomes
// visible) and RELEASEs the batch's records, which the broker redelivers at
// once; set-aside records are ACCEPTed if their marker committed by now,
// else RELEASEd, without waiting.
func (s *Session) Abort(ctx context.Context) error {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	if s.closed {
		return ErrSessionClosed
	}
	s.abortTxn(ctx)
	s.mu.Lock()
	b := s.batch
	s.mu.Unlock()
	if b != nil {
		s.finish(ctx, b, false)
	}
	return nil
}

// Close aborts the open transaction, releases the open batch and closes
// every client. It waits for a method in progress to return. Later calls
// return nil.
func (s *Session) Close() error {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	if s.closed {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.abortTxn(ctx)
	s.mu.Lock()
	b := s.batch
	s.mu.Unlock()
	if b != nil {
		s.finish(ctx, b, false)
	}
	s.shutdown()
	s.log.Info("share-group session closed")
	return nil
}

// shutdown stops the renewer and closes every client, without acknowledging
// or ending anything. s.opMu is held.
func (s *Session) shutdown() {
	s.closed = true
	s.cancel()
	s.wg.Wait()
	s.closeClients()
}

func (s *Session) closeClients() {
	if s.cons != nil {
		s.cons.Close() // releases whatever is still held
	}
	if s.prod != nil {
		s.prod.Close()
		s.prod = nil
	}
	if s.ix != nil {
		s.ix.Close()
	}
	if s.admin != nil {
		s.admin.Close()
	}
}

// crashAt lets a test crash the session at p: every client is closed with
// no EndTxn and no acknowledgement, as if the process died (the share
// consumer's close still releases its records at once, as the broker does
// when a consumer's connection drops). s.opMu is held.
func (s *Session) crashAt(p sessPoint) bool {
	if s.hook == nil || !s.hook(p) {
		return false
	}
	s.shutdown()
	return true
}

// renewLoop renews the open batch's locks when due, without polling.
func (s *Session) renewLoop() {
	defer s.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		t.Reset(s.untilRenew(time.Now()))
		select {
		case <-s.ctx.Done():
			return
		case <-s.wake:
		case <-t.C:
			s.renew()
		}
	}
}

// renewEvery returns the renewal period for a batch (0: never).
func (s *Session) renewEvery(b *sessBatch) time.Duration {
	switch {
	case s.cfg.renewEvery < 0:
		return 0
	case s.cfg.renewEvery > 0:
		return s.cfg.renewEvery
	case b.clock.dur > 0:
		return max(b.clock.dur/3, 10*time.Millisecond)
	}
	return 10 * time.Second
}

func (s *Session) untilRenew(now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.batch
	if b == nil {
		return time.Hour
	}
	every := s.renewEvery(b)
	if every == 0 {
		return time.Hour
	}
	return max(b.renewedAt.Add(every).Sub(now), time.Millisecond)
}

// renew extends the locks of every record the open batch holds. A renewal
// the broker refused marks its partitions lost: the batch counts as lapsed
// and those records are never ACCEPTed by this session.
func (s *Session) renew() {
	s.ack.mu.Lock()
	defer s.ack.mu.Unlock()
	now := time.Now()
	s.mu.Lock()
	b := s.batch
	if b == nil || s.renewEvery(b) == 0 || now.Before(b.renewedAt.Add(s.renewEvery(b))) {
		s.mu.Unlock()
		return
	}
	b.renewedAt = now
	held := b.held()
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(s.ctx, max(b.clock.dur/2, time.Second))
	refused, err := s.ack.ackLocked(ctx, kgo.AckRenew, held...)
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case len(refused) > 0:
		b.clock.refuse(refused)
		s.log.Warn("the broker refused to renew held records; the batch's locks are lost", zap.Error(refusedErr(refused)))
	case err != nil:
		s.log.Warn("renewing held records did not complete", zap.Error(err))
	default:
		b.clock.renewed(now)
	}
}

// checkTopics fails when an input topic does not exist.
func (s *Session) checkTopics(ctx context.Context) error {
	tds, err := s.adm.ListTopics(ctx, s.cfg.topics...)
	if err != nil {
		return fmt.Errorf("session: describe input topics: %w", err)
	}
	for _, t := range s.cfg.topics {
		td, ok := tds[t]
		switch {
		case !ok:
			return fmt.Errorf("session: input topic %q: %w", t, kerr.UnknownTopicOrPartition)
		case td.Err != nil:
			return fmt.Errorf("session: input topic %q: %w", t, td.Err)
		}
	}
	return nil
}

// warnShortDeleteRetention warns, loudly and once per open, when the
// ack-log's tombstones do not last acklog.DeleteRetention, or when that
// cannot be verified. It warns rather than refuses: the setting bounds how
// far back the savepoint restore check sees, not the exactly-once of the
// running job, and an ack-log made by an older Weir has Kafka's default.
func warnShortDeleteRetention(ctx context.Context, log *zap.Logger, adm *kadm.Client, topic string) {
	if _, err := acklog.CheckDeleteRetention(ctx, adm, topic); err != nil {
		if errors.Is(err, acklog.ErrShortDeleteRetention) {
			log.Warn("the ack-log's tombstones are deleted too soon for the savepoint restore check", zap.String("topic", topic), zap.Error(err))
		} else {
			log.Warn("cannot verify the ack-log's delete.retention.ms", zap.String("topic", topic), zap.Error(err))
		}
	}
}
