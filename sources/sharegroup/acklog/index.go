package acklog

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ErrClosed is returned by the catch-up methods of a closed Index.
var ErrClosed = errors.New("index closed")

// Status is the state of a marker's transaction as the Index has read it.
type Status int

const (
	// Open: the marker's transaction has neither committed nor aborted
	// (as far as the Index has read).
	Open Status = iota
	// Committed: the transaction committed (or the marker was written
	// without a transaction): its offsets are processed and acknowledged.
	Committed
	// Aborted: the transaction aborted; the marker means nothing.
	Aborted
)

// String returns "open", "committed" or "aborted".
func (s Status) String() string {
	switch s {
	case Open:
		return "open"
	case Committed:
		return "committed"
	case Aborted:
		return "aborted"
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// Entry is a marker read from the ack-log, with its ack-log offset and the
// status of its transaction at the time of the call. Entries returned by
// the Index share Marker.Ranges with the Index: do not modify them.
type Entry struct {
	Marker Marker
	Offset int64
	Status Status
	// ProducerEpoch is the producer epoch of the record that carried the
	// marker. With the producer id and the checkpoint it identifies the
	// marker's transaction: a transactional id keeps its producer id across
	// transactions, and the epoch bumps at every EndTxn (KIP-890).
	ProducerEpoch int16
}

// sameTxn reports whether two markers were written by one transaction.
func sameTxn(a, b Entry) bool {
	return a.Marker.ProducerID == b.Marker.ProducerID && a.ProducerEpoch == b.ProducerEpoch &&
		a.Marker.Checkpoint == b.Marker.Checkpoint
}

// entry is the Index's record of one live marker.
type entry struct {
	m      Marker
	offset int64
	status Status
	key    string
	born   time.Time // CreatedAt, or the record timestamp if unset
	gone   bool      // forgotten (tombstoned)
	epoch  int16     // producer epoch of the marker's record
}

func (e *entry) export() Entry {
	return Entry{Marker: e.m, Offset: e.offset, Status: e.status, ProducerEpoch: e.epoch}
}

// interval is one range of one marker in a partition's interval list.
type interval struct {
	start, end int64
	e          *entry
}

// intervals holds the open and committed ranges of one topic-partition,
// sorted by start (then ack-log offset). maxLen bounds every interval's
// length, so a point query scans back only over starts within maxLen.
type intervals struct {
	ivs    []interval
	maxLen int64
}

func cmpInterval(a interval, start, offset int64) int {
	return cmp.Or(cmp.Compare(a.start, start), cmp.Compare(a.e.offset, offset))
}

func (l *intervals) add(r Range, e *entry) {
	i, _ := slices.BinarySearchFunc(l.ivs, r, func(a interval, r Range) int { return cmpInterval(a, r.Start, e.offset) })
	l.ivs = slices.Insert(l.ivs, i, interval{start: r.Start, end: r.End, e: e})
	l.maxLen = max(l.maxLen, r.End-r.Start)
}

func (l *intervals) remove(r Range, e *entry) {
	i, found := slices.BinarySearchFunc(l.ivs, r, func(a interval, r Range) int { return cmpInterval(a, r.Start, e.offset) })
	if found && l.ivs[i].e == e {
		l.ivs = slices.Delete(l.ivs, i, i+1)
	}
	if len(l.ivs) == 0 {
		l.maxLen = 0
	}
}

// each calls fn for every interval overlapping [start, end).
func (l *intervals) each(start, end int64, fn func(interval)) {
	// First interval starting at or after end: everything before may overlap.
	i, _ := slices.BinarySearchFunc(l.ivs, end, func(a interval, end int64) int {
		if a.start < end {
			return -1
		}
		return 1
	})
	for i--; i >= 0 && l.ivs[i].start > start-l.maxLen; i-- {
		if l.ivs[i].end > start {
			fn(l.ivs[i])
		}
	}
}

// Index follows the ack-log partition read_uncommitted with control records
// and knows, for every live marker, the status of its transaction: a
// marker written in a transaction is Open until a control record of its
// producer id at a higher offset commits or aborts it; a marker written
// without a transaction is Committed at once. Tombstones (nil values) read
// from the log make it forget the markers with their key (a transactional
// tombstone only once its transaction commits), as compaction will.
// Records that are not markers are skipped and counted (Skipped).
//
// Its methods may be called from several goroutines. Only one catch-up reads
// at a time; the others wait for it and return as soon as what they need
// has been read.
type Index struct {
	cl    *kgo.Client
	adm   *kadm.Client
	topic string

	reader chan struct{} // holds a token while one catch-up reads

	mu          sync.Mutex
	closed      bool
	next        int64               // every record below next is indexed
	byOffset    map[int64]*entry    // live markers by ack-log offset
	byKey       map[string][]*entry // live markers by record key
	open        map[int64][]*entry  // open markers by producer id
	pendingTomb map[int64][]string  // keys of uncommitted tombstones by producer id
	byTP        map[TopicPartition]*intervals
	wm          map[TopicPartition]int64 // highest watermark read per partition
	skipped     int
	// keepGone (KeepTombstoned) keeps tombstoned markers in gone, for
	// CommittedAfter.
	keepGone bool
	gone     map[int64]Entry // tombstoned markers by ack-log offset
}

// NewIndex starts an Index of the ack-log topic with its own kgo client
// (seeded with seeds; opts are applied first, for example SASL or TLS, and
// must not change what is consumed). It consumes partition 0 directly from
// the start, read_uncommitted, keeping control records, with no group. It
// checks that the topic exists with one partition (else an error wrapping
// ErrBadTopic) but reads nothing yet: call CatchUp or CatchUpToEnd.
func NewIndex(ctx context.Context, seeds []string, topic string, opts ...kgo.Opt) (*Index, error) {
	if err := validTopic(topic); err != nil {
		return nil, err
	}
	all := append(slices.Clone(opts),
		kgo.SeedBrokers(seeds...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()),
		kgo.KeepControlRecords(),
	)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		return nil, fmt.Errorf("new index client: %w", err)
	}
	adm := kadm.NewClient(cl)
	n, err := partitionCount(ctx, adm, topic)
	if err == nil && n != 1 {
		err = fmt.Errorf("%w: topic %q has %d partitions, the ack-log needs exactly 1", ErrBadTopic, topic, n)
	} else if errors.Is(err, kerr.UnknownTopicOrPartition) {
		err = fmt.Errorf("%w: %w", ErrBadTopic, err)
	}
	if err != nil {
		cl.Close()
		return nil, err
	}
	ix := newIndex(topic)
	ix.cl, ix.adm = cl, adm
	return ix, nil
}

// newIndex returns an Index with empty state and no client.
func newIndex(topic string) *Index {
	return &Index{
		topic:       topic,
		reader:      make(chan struct{}, 1),
		byOffset:    make(map[int64]*entry),
		byKey:       make(map[string][]*entry),
		open:        make(map[int64][]*entry),
		pendingTomb: make(map[int64][]string),
		byTP:        make(map[TopicPartition]*intervals),
		wm:          make(map[TopicPartition]int64),
		gone:        make(map[int64]Entry),
	}
}

// KeepTombstoned makes the Index remember the markers tombstones make it
// forget, for CommittedAfter: a marker it read before its tombstone, and a
// marker known only from its tombstone's headers (compaction removed the
// marker's record; see Tombstones). For a one-off reading such as a restore
// check: memory then grows with the ack-log's history. Call it before the
// first catch-up.
func (ix *Index) KeepTombstoned() {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.keepGone = true
}

// Topic returns the ack-log topic the Index follows.
func (ix *Index) Topic() string { return ix.topic }

// Position returns the ack-log offset up to which the Index has read: every
// record below it is indexed.
func (ix *Index) Position() int64 {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.next
}

// Len returns the number of markers the Index holds (open, committed and
// aborted ones not yet forgotten).
func (ix *Index) Len() int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return len(ix.byOffset)
}

// Skipped returns how many data records of the ack-log were not markers
// (Decode failed) and were ignored.
func (ix *Index) Skipped() int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.skipped
}

// CatchUp reads the ack-log until every record with an offset below offset
// is indexed (pass a marker's own offset + 1 to include it). It reads
// read_uncommitted, so an open transaction anywhere in the log does not hold
// it back. It returns at once if the Index is already there, and waits (for
// ctx) for records not yet written. If another CatchUp is reading, it waits
// for it and reads on only if still needed.
func (ix *Index) CatchUp(ctx context.Context, offset int64) error {
	if done, err := ix.reached(offset); done || err != nil {
		return err
	}
	select {
	case ix.reader <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("catch up to %d: %w", offset, ctx.Err())
	}
	defer func() { <-ix.reader }()
	for {
		if done, err := ix.reached(offset); done || err != nil {
			return err
		}
		if err := ix.poll(ctx); err != nil {
			return fmt.Errorf("catch up to %d: %w", offset, err)
		}
	}
}

// CatchUpToEnd lists the ack-log's end offset (the read_uncommitted high
// watermark) and catches up to it: afterwards the Index reflects every
// marker and every commit or abort written before the call.
func (ix *Index) CatchUpToEnd(ctx context.Context) error {
	end, err := ix.listOffset(ctx, ix.adm.ListEndOffsets)
	if err != nil {
		return fmt.Errorf("list end offset of %q: %w", ix.topic, err)
	}
	if done, err := ix.reached(end); done || err != nil {
		return err
	}
	// Records below the log start offset will never be read.
	start, err := ix.listOffset(ctx, ix.adm.ListStartOffsets)
	if err != nil {
		return fmt.Errorf("list start offset of %q: %w", ix.topic, err)
	}
	ix.mu.Lock()
	ix.next = max(ix.next, start)
	ix.mu.Unlock()
	return ix.CatchUp(ctx, end)
}

func (ix *Index) listOffset(ctx context.Context, list func(context.Context, ...string) (kadm.ListedOffsets, error)) (int64, error) {
	los, err := list(ctx, ix.topic)
	if err != nil {
		return 0, err
	}
	lo, ok := los.Lookup(ix.topic, 0)
	if !ok {
		return 0, kerr.UnknownTopicOrPartition
	}
	if lo.Err != nil {
		return 0, lo.Err
	}
	return lo.Offset, nil
}

// reached reports whether every record below offset is indexed, or
// ErrClosed.
func (ix *Index) reached(offset int64) (bool, error) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.next >= offset {
		return true, nil
	}
	if ix.closed {
		return false, ErrClosed
	}
	return false, nil
}

// poll reads one batch of fetches and indexes it. Only the holder of the
// reader token calls it.
func (ix *Index) poll(ctx context.Context) error {
	fs := ix.cl.PollFetches(ctx)
	if fs.IsClientClosed() {
		return ErrClosed
	}
	for _, fe := range fs.Errors() {
		switch {
		case errors.Is(fe.Err, kgo.ErrClientClosed):
			return ErrClosed
		case errors.Is(fe.Err, context.Canceled), errors.Is(fe.Err, context.DeadlineExceeded):
			if err := ctx.Err(); err != nil {
				return err
			}
			return fe.Err
		default:
			return fmt.Errorf("fetch %s[%d]: %w", fe.Topic, fe.Partition, fe.Err)
		}
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if p.Topic != ix.topic || p.Partition != 0 {
			return
		}
		ix.next = max(ix.next, p.LogStartOffset)
		for _, r := range p.Records {
			if r.Offset < ix.next {
				continue // already indexed
			}
			ix.ingest(r)
			ix.next = r.Offset + 1
		}
	})
	return nil
}

// ingest indexes one record. ix.mu is held.
func (ix *Index) ingest(r *kgo.Record) {
	if r.Attrs.IsControl() {
		var k kmsg.ControlRecordKey
		if err := k.ReadFrom(r.Key); err != nil {
			return // not a transaction marker we know
		}
		switch k.Type {
		case kmsg.ControlRecordKeyTypeCommit:
			ix.resolve(r.ProducerID, Committed)
		case kmsg.ControlRecordKeyTypeAbort:
			ix.resolve(r.ProducerID, Aborted)
		}
		return
	}
	if r.Value == nil { // tombstone
		if r.Attrs.IsTransactional() {
			ix.pendingTomb[r.ProducerID] = append(ix.pendingTomb[r.ProducerID], string(r.Key))
		} else {
			if ix.keepGone && len(ix.byKey[string(r.Key)]) == 0 {
				ix.keepOrphanTombstone(r)
			}
			ix.forget(string(r.Key))
		}
		return
	}
	if isWatermark(r.Value) {
		// Watermarks are written outside transactions: a transactional
		// one (not Weir's) is not trusted.
		if w, err := DecodeWatermark(r); err == nil && !r.Attrs.IsTransactional() {
			ix.wm[w.TP] = max(ix.wm[w.TP], w.Offset)
		} else {
			ix.skipped++
		}
		return
	}
	m, err := Decode(r)
	if err != nil {
		ix.skipped++
		return
	}
	st := Committed
	if r.Attrs.IsTransactional() {
		st = Open
	}
	born := m.CreatedAt
	if born.IsZero() {
		born = r.Timestamp
	}
	ix.add(m, r.Offset, string(r.Key), born, st, r.ProducerID, r.ProducerEpoch)
}

// add indexes a marker read at offset; an Open one waits for a control
// record of pid. ix.mu is held.
func (ix *Index) add(m Marker, offset int64, key string, born time.Time, st Status, pid int64, epoch int16) {
	e := &entry{m: m, offset: offset, status: st, key: key, born: born, epoch: epoch}
	if st == Open {
		ix.open[pid] = append(ix.open[pid], e)
	}
	ix.byOffset[e.offset] = e
	ix.byKey[e.key] = append(ix.byKey[e.key], e)
	for tp, rs := range m.Ranges {
		l := ix.byTP[tp]
		if l == nil {
			l = &intervals{}
			ix.byTP[tp] = l
		}
		for _, rg := range rs {
			l.add(rg, e)
		}
	}
}

// resolve ends the transaction of producer pid: every open marker of it
// (all at lower offsets than the control record being read) gets st, and its
// pending tombstones take effect on commit. ix.mu is held.
func (ix *Index) resolve(pid int64, st Status) {
	for _, e := range ix.open[pid] {
		if e.gone {
			continue
		}
		e.status = st
		if st == Aborted {
			ix.unlinkRanges(e) // aborted markers never match a lookup or a conflict
		}
	}
	delete(ix.open, pid)
	if st == Committed {
		for _, k := range ix.pendingTomb[pid] {
			ix.forget(k)
		}
	}
	delete(ix.pendingTomb, pid)
}

// keepOrphanTombstone remembers (KeepTombstoned) the marker a tombstone
// deletes when the Index never read the marker itself (compaction removed
// it): from the tombstone's key and headers (Tombstones). A tombstone
// without them (written by an older Weir) or with a key that is not a
// marker's names nothing and is ignored. ix.mu is held.
func (ix *Index) keepOrphanTombstone(r *kgo.Record) {
	m, ok := markerOfKey(string(r.Key))
	if !ok {
		return
	}
	off, st, ok := tombstoneHeaders(r.Headers)
	if !ok {
		return
	}
	if _, seen := ix.gone[off]; !seen {
		ix.gone[off] = Entry{Marker: m, Offset: off, Status: st}
	}
}

// forget drops every marker with key. ix.mu is held.
func (ix *Index) forget(key string) {
	for _, e := range ix.byKey[key] {
		if ix.keepGone {
			ix.gone[e.offset] = e.export()
		}
		e.gone = true
		delete(ix.byOffset, e.offset)
		if e.status != Aborted {
			ix.unlinkRanges(e)
		}
	}
	delete(ix.byKey, key)
}

func (ix *Index) unlinkRanges(e *entry) {
	for tp, rs := range e.m.Ranges {
		l := ix.byTP[tp]
		if l == nil {
			continue
		}
		for _, rg := range rs {
			l.remove(rg, e)
		}
		if len(l.ivs) == 0 {
			delete(ix.byTP, tp)
		}
	}
}

// Lookup returns the marker covering offset of tp that matters for a
// delivered record: the earliest Committed one if any (the record was
// processed and its output committed: ACCEPT it, do not emit it), else the
// earliest Open one (set the record aside until that marker resolves).
// Aborted markers are ignored. An offset below tp's watermark is done: the
// answer is then a Committed entry with Offset -1 (no marker). It answers
// from what has been read: call CatchUpToEnd first for an up-to-date
// answer.
func (ix *Index) Lookup(tp TopicPartition, offset int64) (Entry, bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if wm, ok := ix.wm[tp]; ok && offset < wm {
		return Entry{Offset: -1, Status: Committed}, true
	}
	l := ix.byTP[tp]
	if l == nil {
		return Entry{}, false
	}
	var best *entry
	l.each(offset, offset+1, func(iv interval) {
		e := iv.e
		switch {
		case best == nil,
			e.status == Committed && best.status != Committed,
			e.status == best.status && e.offset < best.offset:
			best = e
		}
	})
	if best == nil {
		return Entry{}, false
	}
	return best.export(), true
}

// Conflicts returns, in ack-log order, every marker at an offset below
// own.Offset, of another transaction, overlapping own's ranges, whose
// transaction is Open or Committed (Aborted ones are ignored): if there is
// any, own's epoch holds records someone else has processed or is
// processing, and own's checkpoint must be declined. Transactions are told
// apart by producer id, producer epoch and checkpoint, never by producer id
// alone: the transactions of one transactional id share a producer id, so
// two checkpoints of one subtask do conflict. Catch up to own.Offset + 1 (or
// at least own.Offset) first. A later marker is never a conflict.
func (ix *Index) Conflicts(own Entry) []Entry {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	seen := make(map[*entry]bool)
	var out []Entry
	for tp, rs := range own.Marker.Ranges {
		l := ix.byTP[tp]
		if l == nil {
			continue
		}
		for _, rg := range rs {
			l.each(rg.Start, rg.End, func(iv interval) {
				e := iv.e
				if seen[e] || e.offset >= own.Offset || e.status == Aborted || sameTxn(e.export(), own) {
					return
				}
				seen[e] = true
				out = append(out, e.export())
			})
		}
	}
	slices.SortFunc(out, func(a, b Entry) int { return cmp.Compare(a.Offset, b.Offset) })
	return out
}

// Watermark returns the highest watermark read for tp: every offset below it
// is done.
func (ix *Index) Watermark(tp TopicPartition) (int64, bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	wm, ok := ix.wm[tp]
	return wm, ok
}

// Lowest returns the lowest offset of tp that an open or committed marker
// covers.
func (ix *Index) Lowest(tp TopicPartition) (int64, bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	l := ix.byTP[tp]
	if l == nil || len(l.ivs) == 0 {
		return 0, false
	}
	return l.ivs[0].start, true
}

// Uncovered returns the offsets of tp in [from, to) that neither a
// Committed marker nor tp's watermark covers, as sorted, merged ranges.
// Open and aborted markers do not cover. Call CatchUpToEnd first.
func (ix *Index) Uncovered(tp TopicPartition, from, to int64) []Range {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if wm, ok := ix.wm[tp]; ok {
		from = max(from, wm)
	}
	if from >= to {
		return nil
	}
	var covered []Range
	if l := ix.byTP[tp]; l != nil {
		l.each(from, to, func(iv interval) {
			if iv.e.status == Committed {
				covered = append(covered, Range{Start: max(iv.start, from), End: min(iv.end, to)})
			}
		})
	}
	covered = normalize(covered)
	var out []Range
	next := from
	for _, c := range covered {
		if c.Start > next {
			out = append(out, Range{Start: next, End: c.Start})
		}
		next = max(next, c.End)
	}
	if next < to {
		out = append(out, Range{Start: next, End: to})
	}
	return out
}

// WithoutOpen splits ranges of tp into what no Open marker (its commit or
// abort not read yet) covers, and whether an Open marker covers any of
// them. On Apache Kafka a transaction's markers become readable after
// EndTxn returns (the coordinator writes them asynchronously), so a
// committer may already have acknowledged what a committed marker covers
// while a reader still sees the marker Open: what an Open marker covers is
// undecided, the rest is not. Call CatchUpToEnd first.
func (ix *Index) WithoutOpen(tp TopicPartition, ranges []Range) (rest []Range, open bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	l := ix.byTP[tp]
	if l == nil {
		return ranges, false
	}
	var covered []Range
	for _, r := range ranges {
		l.each(r.Start, r.End, func(iv interval) {
			if iv.e.status == Open {
				covered = append(covered, Range{Start: max(iv.start, r.Start), End: min(iv.end, r.End)})
			}
		})
	}
	if len(covered) == 0 {
		return ranges, false
	}
	covered = normalize(covered)
	for _, r := range ranges {
		next := r.Start
		for _, c := range covered {
			if c.End <= next || c.Start >= r.End {
				continue
			}
			if c.Start > next {
				rest = append(rest, Range{Start: next, End: c.Start})
			}
			next = max(next, c.End)
		}
		if next < r.End {
			rest = append(rest, Range{Start: next, End: r.End})
		}
	}
	return rest, true
}

// Status returns the marker at ack-log offset with its current status, and
// false if there is none (not read yet, not a marker, or forgotten).
func (ix *Index) Status(offset int64) (Entry, bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	e, ok := ix.byOffset[offset]
	if !ok {
		return Entry{}, false
	}
	return e.export(), true
}

// CommittedAfter returns the committed markers read so far at ack-log
// offsets above offset, by offset (catch up first to see them all).
// Tombstoned markers are gone from the Index and not returned, unless
// KeepTombstoned: then they are, with the status they had when their
// tombstone was read (a marker known only from its tombstone has no
// Ranges).
func (ix *Index) CommittedAfter(offset int64) []Entry {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var out []Entry
	for off, e := range ix.byOffset {
		if off > offset && e.status == Committed {
			out = append(out, e.export())
		}
	}
	for off, e := range ix.gone {
		if off > offset && e.Status == Committed {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b Entry) int { return cmp.Compare(a.Offset, b.Offset) })
	return out
}

// Tombstones returns tombstones (same key, nil value, for the ack-log topic,
// partition 0) for the markers that can no longer matter, older than grace
// at now (by CreatedAt, or the record timestamp if unset):
//   - resolved (committed or aborted) markers whose every range lies below
//     the share start offset of its partition in shareStart (a partition
//     missing from shareStart keeps the marker);
//   - aborted markers, whatever their ranges.
//
// Open markers are never returned. grace must be far beyond the record lock
// duration (say 10x): a tombstoned marker no longer stops a zombie. Markers
// stay in the Index until their tombstones are read back, so a call before
// then returns them again; producing a tombstone twice is harmless.
//
// A tombstone's key is its marker's (Marker.Key: group, member,
// transactional id, producer id, checkpoint, creation time); its headers
// add what the key cannot say, the marker's ack-log offset and whether its
// transaction committed or aborted, so that the marker can still be
// judged (KeepTombstoned) after compaction removed its record.
func (ix *Index) Tombstones(shareStart map[TopicPartition]int64, now time.Time, grace time.Duration) []*kgo.Record {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var dead []*entry
	for _, e := range ix.byOffset {
		if e.status == Open || now.Sub(e.born) <= grace {
			continue
		}
		if e.status == Aborted || belowStart(e.m, shareStart) {
			dead = append(dead, e)
		}
	}
	slices.SortFunc(dead, func(a, b *entry) int { return cmp.Compare(a.offset, b.offset) })
	out := make([]*kgo.Record, 0, len(dead))
	for _, e := range dead {
		out = append(out, &kgo.Record{Topic: ix.topic, Partition: 0, Key: []byte(e.key), Headers: tombstoneHeadersOf(e.offset, e.status)})
	}
	return out
}

// belowStart reports whether every range of m ends at or below its
// partition's share start offset.
func belowStart(m Marker, shareStart map[TopicPartition]int64) bool {
	for tp := range m.Ranges {
		hi, ok := m.MaxOffset(tp)
		if !ok {
			continue
		}
		start, ok := shareStart[tp]
		if !ok || hi >= start {
			return false
		}
	}
	return true
}

// Close stops the Index's client. A CatchUp in progress or later returns
// ErrClosed; lookups keep answering from what was read. Close is idempotent.
func (ix *Index) Close() {
	ix.mu.Lock()
	already := ix.closed
	ix.closed = true
	ix.mu.Unlock()
	if !already {
		ix.cl.Close()
	}
}
