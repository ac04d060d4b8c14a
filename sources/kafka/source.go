package kafka

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
	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/deadletter"
	"github.com/weirstream/weir/internal/kafkatxn"
	"github.com/weirstream/weir/runtime"
)

// New returns a source factory reading Kafka partitions and decoding each
// record with decode (an error sends the record to the dead-letter topic).
// Options are validated here, so a bad job is refused when it is built.
func New[T any](decode func(*kgo.Record) (T, error), opts ...Opt) (func() runtime.Source[T], error) {
	c := defaults()
	for _, o := range opts {
		o.apply(&c)
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	if decode == nil {
		return nil, fmt.Errorf("%w: kafka source: no decode function", ErrInvalidConfig)
	}
	return func() runtime.Source[T] { return &Source[T]{cfg: c, decode: decode} }, nil
}

// tp names a topic partition.
type tp struct {
	topic     string
	partition int32
}

// String is the partition's split name and metric label: "topic-partition"
// (Flink's and Kafka's spelling).
func (p tp) String() string { return p.topic + "-" + strconv.Itoa(int(p.partition)) }

// partition is what a subtask knows of one partition it reads.
type partition struct {
	name      string       // the split name (tp.String)
	next      atomic.Int64 // the next offset to read (the position)
	end       atomic.Int64 // the log end (high watermark) of the last fetch; -1: none yet
	committed atomic.Int64 // last offset committed to the group; -1: none
	stop      int64        // bounded: the offset not to read; -1: unbounded
	done      bool         // bounded and reached stop
	// stable is the largest last stable offset seen (discovery, fetches):
	// the records below it are readable (read_committed), so while next is
	// below it the partition is not idle. The task goroutine's.
	stable int64
}

// found is one discovery's outcome, for the task goroutine.
type found struct {
	parts map[tp]resolved
	drop  []tp // restored partitions of topics no longer read
	err   error
}

// resolved is a newly found partition with its start (and stop) offsets
// and its last stable offset when found.
type resolved struct {
	start, stop, stable int64
}

// Source is one subtask of a Kafka partition source. Build it with New.
type Source[T any] struct {
	cfg    cfg
	decode func(*kgo.Record) (T, error)
	oc     *runtime.OperatorContext
	log    *zap.Logger

	cl    *kgo.Client  // the consumer (direct partitions, read_committed)
	admin *kgo.Client  // discovery, offsets, group commits
	adm   *kadm.Client // on admin
	dlq   *kafkatxn.TxnWriter

	// restored are the positions of the partitions this subtask owns in
	// the restored checkpoint; restoredAny says it held any partition at
	// all (the first discovery then is not the job's first).
	restored    map[tp]int64
	restoredAny bool

	mu    sync.Mutex // parts' map, for the metrics
	parts map[tp]*partition

	foundc      chan found
	discovered  bool // the first discovery arrived
	stopDiscov  context.CancelFunc
	discoveryWG sync.WaitGroup

	// snaps are the positions of pending checkpoints, committed to the
	// group on their completion.
	snaps    map[checkpoint.ID]map[tp]int64
	commitc  chan map[tp]int64
	commitWG sync.WaitGroup

	skipped     atomic.Int64 // records skipped (out of range, reset)
	deadLetters atomic.Int64
	commitFails atomic.Int64
	splitsSent  bool // SetSplits told the runtime the current splits
	// waiting counts the records of each partition in the client, fetched
	// and not yet polled (its hooks are on cl).
	waiting waiting
}

// UnionState implements runtime.UnionState: every subtask restores every
// partition's offset and keeps those of the partitions it owns (Owner).
func (s *Source[T]) UnionState() {}

// clientOpts are the options of the source's clients: the user's last, so
// that the isolation level can be checked after them.
func (s *Source[T]) clientOpts(extra ...kgo.Opt) []kgo.Opt {
	opts := []kgo.Opt{kgo.SeedBrokers(s.cfg.brokers...)}
	opts = append(opts, extra...)
	return append(opts, s.cfg.clientOpts...)
}

// Open implements runtime.Source: it connects, checks read_committed,
// readies the dead-letter writer (committing the restored checkpoint's
// dead-letter transactions), keeps the restored positions of the
// partitions it owns, and starts discovery.
func (s *Source[T]) Open(ctx context.Context, oc *runtime.OperatorContext) error {
	s.oc = oc
	s.log = s.cfg.logger
	if s.log == nil {
		s.log = oc.Logger
	}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	s.log = s.log.With(zap.String("source", "kafka"))
	cl, err := kgo.NewClient(s.clientOpts(kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords(),
		kgo.ConsumeResetOffset(kgo.NoResetOffset()), kgo.WithHooks(&s.waiting))...)
	if err != nil {
		return runtime.Unrecoverable(fmt.Errorf("%w: kafka source: client: %w", ErrInvalidConfig, err))
	}
	s.cl = cl
	if err := checkReadCommitted(cl); err != nil {
		return runtime.Unrecoverable(err)
	}
	if s.admin, err = kgo.NewClient(s.clientOpts()...); err != nil {
		return runtime.Unrecoverable(fmt.Errorf("%w: kafka source: client: %w", ErrInvalidConfig, err))
	}
	s.adm = kadm.NewClient(s.admin)
	if err := s.openDeadLetters(ctx, oc); err != nil {
		return err
	}
	s.parts = map[tp]*partition{}
	s.snaps = map[checkpoint.ID]map[tp]int64{}
	s.restored = map[tp]int64{}
	for _, e := range oc.Restored {
		pos, err := DecodeOffsets(e)
		if err != nil {
			return runtime.Unrecoverable(fmt.Errorf("kafka source: restored state: %w", err))
		}
		for _, p := range pos {
			s.restoredAny = true
			if Owner(p.Topic, p.Partition, oc.Parallelism) == oc.Subtask {
				s.restored[tp{p.Topic, p.Partition}] = p.Offset
			}
		}
	}
	s.registerMetrics(oc.Metrics())
	s.commitc = make(chan map[tp]int64, 1)
	s.commitWG.Add(1)
	go s.committer()
	s.foundc = make(chan found, 1)
	dctx, cancel := context.WithCancel(context.Background())
	s.stopDiscov = cancel
	s.discoveryWG.Add(1)
	go s.discoverLoop(dctx, maps.Clone(s.restored))
	return nil
}

// checkReadCommitted refuses a client that reads records of open and
// aborted transactions (ClientOpts may have set read_uncommitted).
func checkReadCommitted(cl *kgo.Client) error {
	v := cl.OptValue(kgo.FetchIsolationLevel) // the level's wire value: 1 is read_committed
	if il, ok := v.(int8); ok && il == 1 {
		return nil
	}
	return fmt.Errorf("%w: the client's isolation level is %v, not read_committed (1): set by ClientOpts? The source would read records of open and aborted transactions; it sets read_committed and it must stay so",
		ErrReadUncommitted, v)
}

// openDeadLetters readies the transactional dead-letter writer.
func (s *Source[T]) openDeadLetters(ctx context.Context, oc *runtime.OperatorContext) error {
	if err := s.connectDeadLetters(ctx, oc); err != nil {
		return err
	}
	if err := ensureTopic(ctx, s.adm, s.cfg.dlqTopic); err != nil {
		return err
	}
	err := kafkatxn.CheckTransactionTimeout(ctx, s.dlq.Admin(), s.cfg.txnTimeout, oc.Checkpointing)
	switch {
	case errors.Is(err, kafkatxn.ErrInvalidConfig):
		return runtime.Unrecoverable(fmt.Errorf("kafka source: dead-letter transactions: %w", err))
	case err != nil:
		s.log.Warn("cannot read the brokers' transaction.max.timeout.ms; not checked", zap.Error(err))
	}
	if err := s.dlq.Recover(ctx, oc.CommitHandles); err != nil {
		err = fmt.Errorf("kafka source: recover dead-letter transactions: %w", err)
		if errors.Is(err, kafkatxn.ErrTxnLost) {
			return runtime.Unrecoverable(err)
		}
		return err
	}
	return nil
}

// connectDeadLetters creates the dead-letter writer once.
func (s *Source[T]) connectDeadLetters(ctx context.Context, oc *runtime.OperatorContext) error {
	if s.dlq != nil {
		return nil
	}
	log := s.log
	if log == nil {
		log = zap.NewNop()
	}
	prefix := s.cfg.txnPrefix
	if prefix == "" {
		prefix = unsafeChars.ReplaceAllString("weir-"+oc.Job+"-"+oc.UID, "_")
	}
	w, err := kafkatxn.NewTxnWriter(ctx, kafkatxn.Brokers(s.cfg.brokers...), kafkatxn.TransactionalIDPrefix(prefix),
		kafkatxn.Subtask(oc.Subtask, oc.Parallelism), kafkatxn.TransactionTimeout(s.cfg.txnTimeout),
		kafkatxn.ClientOpts(s.cfg.clientOpts...), kafkatxn.Logger(log), kafkatxn.Guarantee(kafkatxn.ExactlyOnce))
	if errors.Is(err, kafkatxn.ErrInvalidConfig) {
		return runtime.Unrecoverable(fmt.Errorf("kafka source: dead letters: %w", err))
	}
	if err != nil {
		return fmt.Errorf("kafka source: dead letters: %w", err)
	}
	s.dlq = w
	return nil
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]`)

// CommitRestored implements runtime.RestoreCommitter: the restored
// checkpoint's dead-letter transactions are committed before any subtask
// opens.
func (s *Source[T]) CommitRestored(ctx context.Context, oc *runtime.OperatorContext) error {
	if err := s.connectDeadLetters(ctx, oc); err != nil {
		return err
	}
	err := s.dlq.CommitRestored(ctx, append(slices.Clone(oc.CommitHandles), oc.OrphanHandles...))
	if errors.Is(err, kafkatxn.ErrTxnLost) {
		return runtime.Unrecoverable(err)
	}
	return err
}

// ensureTopic creates topic with one partition if it does not exist.
func ensureTopic(ctx context.Context, adm *kadm.Client, topic string) error {
	resp, err := adm.CreateTopic(ctx, 1, -1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("kafka source: create dead-letter topic %q: %w", topic, err)
	}
	return nil
}

// pollWait bounds how long one Poll waits for records.
const pollWait = 50 * time.Millisecond

// Poll implements runtime.Source: it takes in what discovery found, then
// emits the records fetched, each from its partition's split.
func (s *Source[T]) Poll(ctx context.Context, out runtime.Collector[T]) error {
	if err := s.takeFound(ctx, false); err != nil {
		return err
	}
	sc, _ := out.(runtime.SplitCollector[T])
	if sc != nil && !s.splitsSent && s.discovered {
		sc.SetSplits(s.activeSplits())
		s.splitsSent = true
	}
	if s.cfg.stop != nil && s.discovered && s.allDone() {
		return runtime.ErrEndOfInput
	}
	fs := s.cl.PollRecords(canceled, s.cfg.maxPoll)
	if fs.NumRecords() == 0 && !slices.ContainsFunc(fs.Errors(), func(e kgo.FetchError) bool { return !ignorable(e.Err) }) {
		pctx, cancel := context.WithTimeout(ctx, pollWait)
		if intr := s.oc.Interrupt(); intr != nil {
			go func() {
				select {
				case <-intr:
					cancel()
				case <-pctx.Done():
				}
			}()
		}
		fs = s.cl.PollRecords(pctx, s.cfg.maxPoll)
		cancel()
	}
	var errs []error
	fs.EachError(func(topic string, p int32, err error) {
		if ignorable(err) {
			return
		}
		errs = append(errs, s.fetchError(ctx, tp{topic, p}, err))
	})
	if err := errors.Join(errs...); err != nil {
		return err
	}
	changed := false
	var perr error
	fs.EachPartition(func(fp kgo.FetchTopicPartition) {
		if perr != nil {
			return
		}
		k := tp{fp.Topic, fp.Partition}
		ps := s.parts[k]
		if ps == nil || ps.done {
			return
		}
		if fp.HighWatermark >= 0 {
			ps.end.Store(fp.HighWatermark)
		}
		ps.stable = max(ps.stable, fp.LastStableOffset)
		for _, r := range fp.Records {
			if r.Offset < ps.next.Load() {
				continue // a fetch from before a reset
			}
			if ps.stop >= 0 && r.Offset >= ps.stop {
				s.finish(k, ps)
				changed = true
				return
			}
			ps.next.Store(r.Offset + 1)
			if r.Attrs.IsControl() {
				continue
			}
			v, err := s.decode(r)
			if err != nil {
				if err := deadletter.Send(ctx, s.dlq, s.log, r, s.cfg.dlqTopic, fmt.Errorf("decode: %w", err), s.oc.RestartCause); err != nil {
					perr = fmt.Errorf("kafka source: %w", err)
					return
				}
				s.deadLetters.Add(1)
				continue
			}
			ts := r.Timestamp.UnixMilli()
			switch {
			case sc != nil:
				sc.CollectFromSplit(ps.name, v, ts)
			default:
				if tc, ok := out.(runtime.TimestampCollector[T]); ok {
					tc.CollectWithTimestamp(v, ts)
				} else {
					out.Collect(v)
				}
			}
		}
		if ps.stop >= 0 && ps.next.Load() >= ps.stop {
			s.finish(k, ps)
			changed = true
		}
	})
	if perr != nil {
		return perr
	}
	// A partition with records to read is not idle, however long it
	// emitted nothing: records fetched and waiting in the client behind
	// another partition's (this poll took the other's), or readable at the
	// broker and not fetched yet (the first fetch of a slow start).
	if sc != nil {
		for k, ps := range s.parts {
			if !ps.done && (s.waiting.has(k) || ps.next.Load() < ps.stable) {
				sc.SplitPending(ps.name)
			}
		}
	}
	// A bounded source whose last partition just finished ends at its next
	// Poll (ErrEndOfInput, then the final watermark): declaring no split
	// now would mark the subtask idle first, and an idle input lets the
	// operators downstream advance their watermark past results that this
	// subtask's records still cause upstream of them (a window that fires
	// later arrives late). docs/internals/event-time.md.
	if changed && sc != nil && !(s.cfg.stop != nil && s.allDone()) {
		sc.SetSplits(s.activeSplits())
	}
	return nil
}

// ignorable reports whether a poll's error only says it was cut short.
func ignorable(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, kgo.ErrClientClosed)
}

// canceled is a context that is done: PollRecords with it returns what is
// buffered without waiting.
var canceled = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// finish ends a bounded partition: it reached its stop offset.
func (s *Source[T]) finish(k tp, ps *partition) {
	ps.done = true
	// Nothing below stop is left to read (what lies between is a control
	// record, aborted or compacted away): the position is stop.
	ps.next.Store(max(ps.next.Load(), ps.stop))
	s.cl.RemoveConsumePartitions(map[string][]int32{k.topic: {k.partition}})
	s.log.Info("partition reached its stop offset", zap.Stringer("partition", k), zap.Int64("stop", ps.stop))
}

// allDone reports whether every partition of a bounded source is done.
func (s *Source[T]) allDone() bool {
	for _, ps := range s.parts {
		if !ps.done {
			return false
		}
	}
	return true
}

// activeSplits names the partitions still read, sorted.
func (s *Source[T]) activeSplits() []string {
	var out []string
	for k, ps := range s.parts {
		if !ps.done {
			out = append(out, k.String())
		}
	}
	slices.Sort(out)
	return out
}

// fetchError handles a partition's fetch error: an offset out of range
// takes the documented policy, anything else fails the task.
func (s *Source[T]) fetchError(ctx context.Context, k tp, err error) error {
	ps := s.parts[k]
	if ps == nil || !errors.Is(err, kerr.OffsetOutOfRange) {
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			return fmt.Errorf("kafka source: %w: partition %s: %w", ErrTopicGone, k, err)
		}
		return fmt.Errorf("kafka source: fetch %s: %w", k, err)
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	starts, lerr := s.adm.ListStartOffsets(lctx, k.topic)
	if lerr == nil {
		lerr = starts.Error()
	}
	if lerr != nil {
		return fmt.Errorf("kafka source: partition %s out of range at %d; its log start: %w", k, ps.next.Load(), lerr)
	}
	ends, lerr := s.adm.ListEndOffsets(lctx, k.topic)
	if lerr == nil {
		lerr = ends.Error()
	}
	if lerr != nil {
		return fmt.Errorf("kafka source: partition %s out of range at %d; its log end: %w", k, ps.next.Load(), lerr)
	}
	lo, _ := starts.Lookup(k.topic, k.partition)
	hi, _ := ends.Lookup(k.topic, k.partition)
	to, err := s.outOfRange(k, ps.next.Load(), lo.Offset, hi.Offset)
	if err != nil {
		return err
	}
	ps.next.Store(to)
	s.cl.RemoveConsumePartitions(map[string][]int32{k.topic: {k.partition}})
	s.cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{k.topic: {k.partition: kgo.NewOffset().At(to)}})
	return nil
}

// outOfRange applies the out-of-range policy to position pos of partition
// k whose log spans [start, end): it returns where to read, or the error.
// Records skipped (start - pos) are counted and logged.
func (s *Source[T]) outOfRange(k tp, pos, start, end int64) (int64, error) {
	why := fmt.Sprintf("position %d is below the log start %d (records deleted by retention or truncation)", pos, start)
	var skipped int64
	if pos < start {
		skipped = start - pos
	} else {
		why = fmt.Sprintf("position %d is past the log end %d (the topic was deleted and created again, or the log truncated)", pos, end)
	}
	if s.cfg.outOfRange == FailOnOutOfRange {
		return 0, runtime.Unrecoverable(fmt.Errorf("kafka source: %w: partition %s: %s", ErrOffsetOutOfRange, k, why))
	}
	s.skipped.Add(skipped)
	s.log.Error("partition out of range: resetting to the log start (OnOutOfRange(ResetToEarliest))",
		zap.Stringer("partition", k), zap.String("why", why), zap.Int64("reset_to", start), zap.Int64("records_skipped", skipped))
	return start, nil
}

// takeFound takes in a discovery's outcome, if one is ready (or waits for
// it when wait).
func (s *Source[T]) takeFound(ctx context.Context, wait bool) error {
	var f found
	if wait {
		select {
		case f = <-s.foundc:
		case <-ctx.Done():
			return ctx.Err()
		}
	} else {
		select {
		case f = <-s.foundc:
		default:
			return nil
		}
	}
	if f.err != nil {
		return f.err
	}
	s.discovered = true
	for _, k := range f.drop {
		delete(s.restored, k)
	}
	if len(f.parts) == 0 {
		return nil
	}
	add := map[string]map[int32]kgo.Offset{}
	s.mu.Lock()
	for k, r := range f.parts {
		if s.parts[k] != nil {
			continue
		}
		ps := &partition{name: k.String(), stop: r.stop, stable: r.stable}
		ps.next.Store(r.start)
		ps.end.Store(-1)
		ps.committed.Store(-1)
		s.parts[k] = ps
		if r.stop >= 0 && r.start >= r.stop {
			ps.done = true
			continue
		}
		if add[k.topic] == nil {
			add[k.topic] = map[int32]kgo.Offset{}
		}
		add[k.topic][k.partition] = kgo.NewOffset().At(r.start)
		s.log.Info("reading partition", zap.Stringer("partition", k), zap.Int64("from", r.start), zap.Int64("stop", r.stop))
	}
	s.mu.Unlock()
	s.cl.AddConsumePartitions(add)
	s.splitsSent = false
	return nil
}

// Snapshot implements runtime.Source: one entry per partition the subtask
// owns (read, or restored and not read yet), with its position; the
// dead-letter transaction of the epoch is pre-committed.
func (s *Source[T]) Snapshot(ctx context.Context, id checkpoint.ID) (runtime.OperatorState, error) {
	pos := map[tp]int64{}
	maps.Copy(pos, s.restored)
	for k, ps := range s.parts {
		pos[k] = ps.next.Load()
	}
	keys := slices.SortedFunc(maps.Keys(pos), func(a, b tp) int {
		if c := strings.Compare(a.topic, b.topic); c != 0 {
			return c
		}
		return int(a.partition - b.partition)
	})
	st := runtime.OperatorState{Entries: make([][]byte, 0, len(keys))}
	for _, k := range keys {
		st.Entries = append(st.Entries, encodeOffset(PartitionOffset{Topic: k.topic, Partition: k.partition, Offset: pos[k]}))
	}
	if _, _, err := s.dlq.PreCommit(ctx, id); err != nil {
		return runtime.OperatorState{}, fmt.Errorf("kafka source: dead letters: %w", err)
	}
	st.Handles = s.dlq.Pending()
	s.snaps[id] = pos
	return st, nil
}

// NotifyCheckpointComplete implements checkpoint.Listener: the dead-letter
// transactions of checkpoints up to id commit, and the positions of
// checkpoint id go to the consumer group (Group) for monitoring, in the
// background.
func (s *Source[T]) NotifyCheckpointComplete(ctx context.Context, id checkpoint.ID) error {
	if err := s.dlq.Commit(ctx, id); err != nil {
		return fmt.Errorf("kafka source: dead letters: %w", err)
	}
	pos := s.snaps[id]
	for cid := range s.snaps {
		if cid <= id {
			delete(s.snaps, cid)
		}
	}
	if pos == nil || s.cfg.group == "" || s.commitc == nil {
		return nil
	}
	select { // the newest positions replace ones not yet sent
	case <-s.commitc:
	default:
	}
	s.commitc <- pos
	return nil
}

// NotifyCheckpointAborted implements checkpoint.Listener: the aborted
// checkpoint's dead-letter transaction stays pending and is committed with
// the next completed checkpoint (checkpoint.AbortCarrier).
func (s *Source[T]) NotifyCheckpointAborted(_ context.Context, id checkpoint.ID) error {
	delete(s.snaps, id)
	return nil
}

// CarriesAbortedCheckpoints implements checkpoint.AbortCarrier.
func (s *Source[T]) CarriesAbortedCheckpoints() {}

// NotifyJobCanceled implements checkpoint.CancelListener: it commits the
// dead-letter transactions the last completed checkpoint covers and aborts
// later ones.
func (s *Source[T]) NotifyJobCanceled(ctx context.Context, last checkpoint.ID) error {
	if s.dlq == nil {
		return nil
	}
	return s.dlq.EndJob(ctx, last)
}

// committer commits positions to the group, one set at a time; a failure
// (a foreign group with members, an unreachable coordinator) is logged and
// counted, never more: the commit is for monitoring only.
func (s *Source[T]) committer() {
	defer s.commitWG.Done()
	for pos := range s.commitc {
		os := kadm.Offsets{}
		for k, o := range pos {
			os.Add(kadm.Offset{Topic: k.topic, Partition: k.partition, At: o, LeaderEpoch: -1})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := s.adm.CommitOffsets(ctx, s.cfg.group, os)
		cancel()
		if err == nil {
			err = resp.Error()
		}
		if err != nil {
			s.commitFails.Add(1)
			s.log.Warn("cannot commit offsets to the consumer group (monitoring only; what is read is unaffected)",
				zap.String("group", s.cfg.group), zap.Error(err))
			continue
		}
		s.mu.Lock()
		for k, o := range pos {
			if ps := s.parts[k]; ps != nil {
				ps.committed.Store(o)
			}
		}
		s.mu.Unlock()
	}
}

// Close implements runtime.Source.
func (s *Source[T]) Close() error {
	if s.stopDiscov != nil {
		s.stopDiscov()
		s.discoveryWG.Wait()
		s.stopDiscov = nil
	}
	if s.commitc != nil {
		close(s.commitc)
		s.commitWG.Wait()
		s.commitc = nil
	}
	if s.cl != nil {
		s.cl.Close()
	}
	if s.admin != nil {
		s.admin.Close()
	}
	if s.dlq != nil {
		s.dlq.Close()
	}
	return nil
}

var (
	_ runtime.UnionState        = (*Source[int])(nil)
	_ runtime.RestoreCommitter  = (*Source[int])(nil)
	_ checkpoint.Listener       = (*Source[int])(nil)
	_ checkpoint.CancelListener = (*Source[int])(nil)
	_ checkpoint.AbortCarrier   = (*Source[int])(nil)
	_ runtime.Source[int]       = (*Source[int])(nil)
)
