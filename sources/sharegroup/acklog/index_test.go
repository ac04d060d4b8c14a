package acklog

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func TestIndexFollowsTransactionStatus(t *testing.T) {
	f := newFixture(t)
	topic := f.ackTopic("acklog")
	ix := f.index(topic)

	t.Run("open, then committed", func(t *testing.T) {
		w := f.writer(topic, "commit")
		e := w.txn(Open, 1, Range{0, 10})
		if err := ix.CatchUp(testCtx(t), e.Offset+1); err != nil {
			t.Fatalf("CatchUp: %v", err)
		}
		wantStatus(t, ix, e, Open)
		w.end(true)
		catchUpToEnd(t, ix)
		wantStatus(t, ix, e, Committed)
	})
	t.Run("open, then aborted", func(t *testing.T) {
		w := f.writer(topic, "abort")
		e := w.txn(Open, 1, Range{10, 20})
		if err := ix.CatchUp(testCtx(t), e.Offset+1); err != nil {
			t.Fatalf("CatchUp: %v", err)
		}
		wantStatus(t, ix, e, Open)
		w.end(false)
		catchUpToEnd(t, ix)
		wantStatus(t, ix, e, Aborted)
	})
	t.Run("two producers interleaved", func(t *testing.T) {
		a, b := f.writer(topic, "a"), f.writer(topic, "b")
		if a.pid == b.pid {
			t.Fatalf("producers share id %d", a.pid)
		}
		a.begin()
		b.begin()
		ea1 := a.write(a.marker(1, Range{0, 5}))
		eb1 := b.write(b.marker(1, Range{5, 9}))
		ea2 := a.write(a.marker(1, Range{20, 25}))
		b.end(false)
		catchUpToEnd(t, ix)
		wantStatus(t, ix, ea1, Open)
		wantStatus(t, ix, ea2, Open)
		wantStatus(t, ix, eb1, Aborted)
		b.begin()
		eb2 := b.write(b.marker(2, Range{5, 9}))
		a.end(true)
		catchUpToEnd(t, ix)
		wantStatus(t, ix, ea1, Committed)
		wantStatus(t, ix, ea2, Committed)
		wantStatus(t, ix, eb2, Open)
		b.end(true)
		catchUpToEnd(t, ix)
		wantStatus(t, ix, eb2, Committed)
		wantStatus(t, ix, eb1, Aborted)
	})
	t.Run("one producer, sequential transactions", func(t *testing.T) {
		w := f.writer(topic, "seq")
		e1 := w.txn(Committed, 1, Range{30, 31})
		e2 := w.txn(Aborted, 2, Range{31, 32})
		e3 := w.txn(Committed, 3, Range{31, 32})
		e4 := w.txn(Open, 4, Range{32, 33})
		catchUpToEnd(t, ix)
		for _, e := range []Entry{e1, e2, e3, e4} {
			if e.Marker.ProducerID != w.pid {
				t.Fatalf("producer id changed across transactions: %d, want %d", e.Marker.ProducerID, w.pid)
			}
		}
		wantStatus(t, ix, e1, Committed)
		wantStatus(t, ix, e2, Aborted)
		wantStatus(t, ix, e3, Committed)
		wantStatus(t, ix, e4, Open)
	})
	t.Run("non-transactional marker is committed at once", func(t *testing.T) {
		cl := f.client()
		m := Marker{Group: "g", ProducerID: -1, Ranges: map[TopicPartition][]Range{tp0: {{50, 51}}}}
		r := m.Record(topic)
		if err := cl.ProduceSync(testCtx(t), r).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
		catchUpToEnd(t, ix)
		wantStatus(t, ix, Entry{Marker: m, Offset: r.Offset}, Committed)
	})
	t.Run("a fresh index rebuilds the same statuses", func(t *testing.T) {
		fresh := f.index(topic)
		catchUpToEnd(t, fresh)
		if fresh.Len() != ix.Len() || fresh.Position() != ix.Position() {
			t.Fatalf("fresh index holds %d markers up to %d, want %d up to %d", fresh.Len(), fresh.Position(), ix.Len(), ix.Position())
		}
		for off := range ix.Position() {
			a, aok := ix.Status(off)
			b, bok := fresh.Status(off)
			if aok != bok || a.Status != b.Status || a.Offset != b.Offset {
				t.Fatalf("offset %d: fresh %v/%v, live %v/%v", off, b.Status, bok, a.Status, aok)
			}
		}
	})
}

func TestConflicts(t *testing.T) {
	f := newFixture(t)
	tests := []struct {
		name string
		// earlier marker: same producer as own?, its end state, its range
		samePID bool
		earlier Status
		rg      Range
		// later: the other marker is written after own
		later bool
		// sameTxn: the earlier marker is written in own's transaction
		sameTxn bool
		want    bool
	}{
		{name: "earlier committed overlapping marker of another producer", earlier: Committed, rg: Range{5, 15}, want: true},
		{name: "earlier open overlapping marker of another producer", earlier: Open, rg: Range{9, 10}, want: true},
		{name: "earlier aborted overlapping marker", earlier: Aborted, rg: Range{0, 20}},
		{name: "later committed overlapping marker", earlier: Committed, rg: Range{0, 20}, later: true},
		{name: "later open overlapping marker", earlier: Open, rg: Range{0, 20}, later: true},
		// One transactional id keeps its producer id across transactions:
		// an earlier transaction of the same id is another transaction.
		{name: "same producer id, earlier committed transaction", samePID: true, earlier: Committed, rg: Range{0, 20}, want: true},
		{name: "same producer id, earlier open marker of the same transaction", samePID: true, earlier: Open, rg: Range{0, 20}, sameTxn: true},
		{name: "non-overlapping committed marker", earlier: Committed, rg: Range{10, 20}},
		{name: "touching but not overlapping", earlier: Open, rg: Range{0, 2}},
	}
	ownRanges := []Range{{2, 4}, {6, 10}}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topic := f.ackTopic(fmt.Sprintf("conflicts-%d", i))
			own := f.writer(topic, topic+"-own")
			other := own
			if !tt.samePID {
				other = f.writer(topic, topic+"-other")
			}
			var oe, e Entry
			if tt.later {
				own.begin()
				e = own.write(own.marker(2, ownRanges...))
				oe = other.txn(tt.earlier, 1, tt.rg)
			} else if tt.sameTxn {
				own.begin()
				oe = own.write(own.marker(2, tt.rg))
				e = own.write(own.marker(2, ownRanges...))
			} else {
				oe = other.txn(tt.earlier, 1, tt.rg)
				own.begin()
				e = own.write(own.marker(2, ownRanges...))
			}
			ix := f.index(topic)
			if err := ix.CatchUp(testCtx(t), e.Offset+1); err != nil {
				t.Fatalf("CatchUp: %v", err)
			}
			got := ix.Conflicts(e)
			var want []int64
			if tt.want {
				want = []int64{oe.Offset}
			}
			if !slices.Equal(offsetsOf(got), want) {
				t.Fatalf("Conflicts = %v, want offsets %v", got, want)
			}
			if tt.want && got[0].Status != tt.earlier {
				t.Fatalf("conflict status %v, want %v", got[0].Status, tt.earlier)
			}
		})
	}
}

func TestConflictsListsEveryEarlierMarkerInLogOrder(t *testing.T) {
	f := newFixture(t)
	topic := f.ackTopic("acklog")
	tp1 := TopicPartition{"input", 1}
	a, b, c, own := f.writer(topic, "a"), f.writer(topic, "b"), f.writer(topic, "c"), f.writer(topic, "own")
	ea := a.txn(Committed, 1, Range{0, 3})
	b.begin()
	mb := b.marker(1)
	mb.Ranges = map[TopicPartition][]Range{tp1: {{7, 8}}, tp0: {{100, 101}}}
	eb := b.write(mb)
	c.txn(Aborted, 1, Range{0, 100})
	own.begin()
	m := own.marker(2, Range{2, 5})
	m.Ranges[tp1] = []Range{{0, 10}}
	e := own.write(m)
	ix := f.index(topic)
	if err := ix.CatchUp(testCtx(t), e.Offset+1); err != nil {
		t.Fatalf("CatchUp: %v", err)
	}
	got := ix.Conflicts(e)
	if want := []int64{ea.Offset, eb.Offset}; !slices.Equal(offsetsOf(got), want) {
		t.Fatalf("Conflicts = %v, want offsets %v", offsetsOf(got), want)
	}
	if got[0].Status != Committed || got[1].Status != Open {
		t.Fatalf("statuses %v, %v; want committed, open", got[0].Status, got[1].Status)
	}
}

func TestLookupPrefersCommittedAndIgnoresAborted(t *testing.T) {
	f := newFixture(t)
	topic := f.ackTopic("acklog")
	a, b, c, d := f.writer(topic, "a"), f.writer(topic, "b"), f.writer(topic, "c"), f.writer(topic, "d")
	aborted := a.txn(Aborted, 1, Range{0, 10})
	open := b.txn(Open, 1, Range{5, 15})
	committed := c.txn(Committed, 1, Range{8, 12})
	laterOpen := d.txn(Open, 2, Range{14, 30})
	// Starts after the committed marker, so a scan meets it first.
	f.writer(topic, "e").txn(Open, 2, Range{9, 11})
	ix := f.index(topic)
	catchUpToEnd(t, ix)
	tests := []struct {
		tp     TopicPartition
		off    int64
		want   int64 // ack-log offset, -1 for none
		status Status
	}{
		{tp0, 0, -1, 0},                              // only aborted
		{tp0, 4, -1, 0},                              // only aborted
		{tp0, 5, open.Offset, Open},                  // aborted and open
		{tp0, 8, committed.Offset, Committed},        // all three
		{tp0, 10, committed.Offset, Committed},       // two open and committed
		{tp0, 11, committed.Offset, Committed},       // open and committed
		{tp0, 12, open.Offset, Open},                 // open only
		{tp0, 14, open.Offset, Open},                 // two open: the earlier
		{tp0, 15, laterOpen.Offset, Open},            // later open only
		{tp0, 29, laterOpen.Offset, Open},            // end of range
		{tp0, 30, -1, 0},                             // past every range
		{TopicPartition{"input", 1}, 8, -1, 0},       // another partition
		{TopicPartition{"other", 0}, 8, -1, Aborted}, // another topic
	}
	for _, tt := range tests {
		got, ok := ix.Lookup(tt.tp, tt.off)
		if tt.want < 0 {
			if ok {
				t.Errorf("Lookup(%v, %d) = offset %d %v, want none", tt.tp, tt.off, got.Offset, got.Status)
			}
			continue
		}
		if !ok || got.Offset != tt.want || got.Status != tt.status {
			t.Errorf("Lookup(%v, %d) = offset %d %v (found %v), want offset %d %v", tt.tp, tt.off, got.Offset, got.Status, ok, tt.want, tt.status)
		}
	}
	if _, ok := ix.Status(aborted.Offset); !ok {
		t.Errorf("aborted marker at %d not kept for Status", aborted.Offset)
	}
	// The open marker commits: it now wins over the later committed one.
	b.end(true)
	catchUpToEnd(t, ix)
	if got, ok := ix.Lookup(tp0, 8); !ok || got.Offset != open.Offset || got.Status != Committed {
		t.Errorf("after commit Lookup(8) = offset %d %v, want the earlier committed marker %d", got.Offset, got.Status, open.Offset)
	}
}

func TestCatchUpReadsPastAnOpenTransaction(t *testing.T) {
	f := newFixture(t)
	topic := f.ackTopic("acklog")
	stuck, own := f.writer(topic, "stuck"), f.writer(topic, "own")
	se := stuck.txn(Open, 1, Range{0, 10}) // never ended: pins the last stable offset
	e := own.txn(Open, 2, Range{5, 6})
	ix := f.index(topic)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := ix.CatchUp(ctx, e.Offset+1); err != nil {
		t.Fatalf("CatchUp past an open transaction: %v", err)
	}
	wantStatus(t, ix, se, Open)
	wantStatus(t, ix, e, Open)
	if got := ix.Conflicts(e); !slices.Equal(offsetsOf(got), []int64{se.Offset}) {
		t.Fatalf("Conflicts = %v, want the open marker at %d", offsetsOf(got), se.Offset)
	}
	if err := ix.CatchUpToEnd(ctx); err != nil {
		t.Fatalf("CatchUpToEnd past an open transaction: %v", err)
	}
}

func TestCatchUpConcurrentCallers(t *testing.T) {
	f := newFixture(t)
	topic := f.ackTopic("acklog")
	ix := f.index(topic)
	writers := make([]*txnWriter, 4)
	for i := range writers {
		writers[i] = f.writer(topic, fmt.Sprintf("lane-%d", i))
	}
	var wg sync.WaitGroup
	errs := make([]error, len(writers))
	entries := make([]Entry, len(writers))
	for i, w := range writers {
		wg.Go(func() {
			for cp := range uint64(5) {
				w.begin()
				m := w.marker(cp, Range{int64(i*100) + int64(cp), int64(i*100) + int64(cp) + 1})
				r := m.Record(topic)
				if err := w.cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
					errs[i] = err
					return
				}
				entries[i] = Entry{Marker: m, Offset: r.Offset}
				if err := ix.CatchUp(context.Background(), r.Offset+1); err != nil {
					errs[i] = err
					return
				}
				if st, ok := ix.Status(r.Offset); !ok || st.Status != Open {
					errs[i] = fmt.Errorf("own marker at %d: %v %v after CatchUp", r.Offset, st.Status, ok)
					return
				}
				if c := ix.Conflicts(entries[i]); len(c) != 0 {
					errs[i] = fmt.Errorf("unexpected conflicts %v", offsetsOf(c))
					return
				}
				ix.Lookup(tp0, int64(i*100))
				if err := w.cl.EndTransaction(context.Background(), kgo.TryCommit); err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("lane %d: %v", i, err)
		}
	}
	catchUpToEnd(t, ix)
	if ix.Len() != 4*5 {
		t.Fatalf("Len = %d, want 20", ix.Len())
	}
	for i, e := range entries {
		wantStatus(t, ix, e, Committed)
		if got, ok := ix.Lookup(tp0, int64(i*100)+4); !ok || got.Offset != e.Offset {
			t.Fatalf("Lookup lane %d = %d %v, want %d", i, got.Offset, ok, e.Offset)
		}
	}
}

func TestCatchUpStopsOnContextAndClose(t *testing.T) {
	f := newFixture(t)
	topic := f.ackTopic("acklog")
	ix, err := NewIndex(testCtx(t), f.seeds, topic)
	if err != nil {
		t.Fatalf("NewIndex: %v", err)
	}
	defer ix.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := ix.CatchUp(ctx, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("CatchUp beyond the end = %v, want DeadlineExceeded", err)
	}

	done := make(chan error, 2)
	for range 2 { // one reads, one waits for the reader
		go func() { done <- ix.CatchUp(context.Background(), 1000) }()
	}
	time.Sleep(20 * time.Millisecond) // let them block (not a timing assertion)
	ix.Close()
	for range 2 {
		select {
		case err := <-done:
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("CatchUp during Close = %v, want ErrClosed", err)
			}
		case <-testCtx(t).Done():
			t.Fatal("CatchUp did not return after Close")
		}
	}
	if err := ix.CatchUpToEnd(testCtx(t)); err == nil {
		t.Fatal("CatchUpToEnd after Close succeeded")
	}
	ix.Close() // idempotent
}

func TestIndexSkipsForeignRecords(t *testing.T) {
	f := newFixture(t)
	topic := f.ackTopic("acklog")
	cl := f.client()
	if err := cl.ProduceSync(testCtx(t), &kgo.Record{Topic: topic, Key: []byte("x"), Value: []byte("not a marker")}).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	e := f.writer(topic, "w").txn(Committed, 1, Range{0, 1})
	ix := f.index(topic)
	catchUpToEnd(t, ix)
	if ix.Skipped() != 1 || ix.Len() != 1 {
		t.Fatalf("Skipped = %d, Len = %d; want 1, 1", ix.Skipped(), ix.Len())
	}
	wantStatus(t, ix, e, Committed)
}

func TestDecodeRejectsRealControlRecords(t *testing.T) {
	f := newFixture(t)
	topic := f.ackTopic("acklog")
	f.writer(topic, "w").txn(Committed, 1, Range{0, 1})
	cl := f.client(kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}),
		kgo.KeepControlRecords())
	ctx := testCtx(t)
	var markers, controls int
	for markers+controls < 2 {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			t.Fatalf("poll: %v", err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			_, err := Decode(r)
			switch {
			case r.Attrs.IsControl():
				controls++
				if !errors.Is(err, ErrBadMarker) {
					t.Errorf("Decode(control record) = %v, want ErrBadMarker", err)
				}
			default:
				markers++
				if err != nil {
					t.Errorf("Decode(marker) = %v", err)
				}
			}
		})
	}
	if markers != 1 || controls != 1 {
		t.Fatalf("read %d markers and %d control records, want 1 and 1", markers, controls)
	}
}

func TestTombstonesAfterGraceAndForgetting(t *testing.T) {
	f := newFixture(t)
	topic := f.ackTopic("acklog")
	now := time.Now()
	old := now.Add(-2 * time.Hour)
	grace := time.Hour

	a, b, c, d := f.writer(topic, "a"), f.writer(topic, "b"), f.writer(topic, "c"), f.writer(topic, "d")
	write := func(w *txnWriter, st Status, created time.Time, rs ...Range) Entry {
		w.begin()
		m := w.marker(1, rs...)
		m.CreatedAt = created
		e := w.write(m)
		if st != Open {
			w.end(st == Committed)
		}
		return e
	}
	committedOld := write(a, Committed, old, Range{0, 10})
	abortedOld := write(b, Aborted, old, Range{0, 100})
	committedNew := write(a, Committed, now, Range{10, 20})
	abortedNew := write(c, Aborted, now, Range{50, 60})
	openOld := write(d, Open, old, Range{20, 30})
	ix := f.index(topic)
	catchUpToEnd(t, ix)

	keysOf := func(rs []*kgo.Record) []string {
		var ks []string
		for _, r := range rs {
			if r.Value != nil || r.Topic != topic || r.Partition != 0 {
				t.Fatalf("tombstone %+v: want nil value for %s partition 0", r, topic)
			}
			ks = append(ks, string(r.Key))
		}
		return ks
	}
	key := func(e Entry) string { return string(e.Marker.Key()) }
	tests := []struct {
		name  string
		start map[TopicPartition]int64
		grace time.Duration
		want  []string
	}{
		{"share start not past the committed marker", map[TopicPartition]int64{tp0: 9}, grace, []string{key(abortedOld)}},
		{"share start past the old committed marker", map[TopicPartition]int64{tp0: 10}, grace, []string{key(committedOld), key(abortedOld)}},
		{"share start past everything", map[TopicPartition]int64{tp0: 1000}, grace, []string{key(committedOld), key(abortedOld)}},
		{"no share start for the partition", map[TopicPartition]int64{{"input", 1}: 1000}, grace, []string{key(abortedOld)}},
		{"grace longer than every age", map[TopicPartition]int64{tp0: 1000}, 3 * time.Hour, nil},
		{"zero grace takes new resolved markers too", map[TopicPartition]int64{tp0: 1000}, -time.Minute,
			[]string{key(committedOld), key(abortedOld), key(committedNew), key(abortedNew)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := keysOf(ix.Tombstones(tt.start, now, tt.grace))
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Tombstones keys:\n got %q\nwant %q", got, tt.want)
			}
		})
	}

	// Produce the tombstones in a transaction that aborts: nothing is forgotten.
	ts := ix.Tombstones(map[TopicPartition]int64{tp0: 1000}, now, grace)
	tw := f.writer(topic, "gc")
	tw.begin()
	if err := tw.cl.ProduceSync(testCtx(t), ts...).FirstErr(); err != nil {
		t.Fatalf("produce tombstones: %v", err)
	}
	tw.end(false)
	catchUpToEnd(t, ix)
	if ix.Len() != 5 {
		t.Fatalf("after aborted tombstones Len = %d, want 5", ix.Len())
	}
	// Then commit them: both markers are forgotten.
	ts = ix.Tombstones(map[TopicPartition]int64{tp0: 1000}, now, grace)
	tw.begin()
	if err := tw.cl.ProduceSync(testCtx(t), ts...).FirstErr(); err != nil {
		t.Fatalf("produce tombstones: %v", err)
	}
	tw.end(true)
	catchUpToEnd(t, ix)
	if ix.Len() != 3 {
		t.Fatalf("after committed tombstones Len = %d, want 3", ix.Len())
	}
	for _, e := range []Entry{committedOld, abortedOld} {
		if _, ok := ix.Status(e.Offset); ok {
			t.Errorf("tombstoned marker at %d still indexed", e.Offset)
		}
	}
	if got, ok := ix.Lookup(tp0, 5); ok {
		t.Errorf("Lookup(5) = %d after its marker was tombstoned, want none", got.Offset)
	}
	if got := ix.Tombstones(map[TopicPartition]int64{tp0: 1000}, now, grace); len(got) != 0 {
		t.Errorf("tombstones proposed again: %q", keysOf(got))
	}
	wantStatus(t, ix, committedNew, Committed)
	wantStatus(t, ix, openOld, Open)

	// A plain (non-transactional) tombstone takes effect at once.
	plain := ix.Tombstones(map[TopicPartition]int64{tp0: 1000}, now, -time.Minute)
	if err := f.client().ProduceSync(testCtx(t), plain...).FirstErr(); err != nil {
		t.Fatalf("produce tombstones: %v", err)
	}
	catchUpToEnd(t, ix)
	if ix.Len() != 1 {
		t.Fatalf("after plain tombstones Len = %d, want 1 (the open marker)", ix.Len())
	}
	wantStatus(t, ix, openOld, Open)

	// After compaction a fresh index reads the same live markers.
	d.end(true)
	f.c.Compact()
	fresh := f.index(topic)
	catchUpToEnd(t, fresh)
	if fresh.Len() != 1 {
		t.Fatalf("fresh index after compaction holds %d markers, want 1", fresh.Len())
	}
	wantStatus(t, fresh, openOld, Committed)
}

// A watermark covers every offset below it: Lookup answers Committed for
// them (a record whose marker was tombstoned, redelivered after its share
// state was lost), and Uncovered leaves them out.
func TestWatermarkCoversOffsetsBelowIt(t *testing.T) {
	f := newFixture(t)
	topic := f.ackTopic("watermark")
	a := f.writer(topic, "a")
	ea := a.txn(Committed, 1, Range{10, 20})
	a.txn(Open, 2, Range{20, 25})
	wm := Watermark{Group: "g", TP: tp0, Offset: 8}
	if err := f.client().ProduceSync(testCtx(t), wm.Record(topic)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	ix := f.index(topic)
	if err := ix.CatchUpToEnd(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if got, ok := ix.Watermark(tp0); !ok || got != 8 {
		t.Fatalf("Watermark = %d, %v; want 8", got, ok)
	}
	for _, tt := range []struct {
		off    int64
		ok     bool
		offset int64
		status Status
	}{
		{0, true, -1, Committed},
		{7, true, -1, Committed},
		{8, false, 0, 0},
		{10, true, ea.Offset, Committed},
		{22, true, ea.Offset + 2, Open},
		{30, false, 0, 0},
	} {
		got, ok := ix.Lookup(tp0, tt.off)
		if ok != tt.ok || (ok && (got.Status != tt.status || (tt.offset >= 0 && got.Offset != tt.offset) || (tt.offset < 0 && got.Offset != -1))) {
			t.Errorf("Lookup(%d) = %d %v (%v), want %d %v (%v)", tt.off, got.Offset, got.Status, ok, tt.offset, tt.status, tt.ok)
		}
	}
	// [8, 10) and the open marker's [20, 25) and [25, 30) are not done.
	if got, want := ix.Uncovered(tp0, 0, 30), []Range{{8, 10}, {20, 30}}; !slices.Equal(got, want) {
		t.Fatalf("Uncovered(0, 30) = %v, want %v", got, want)
	}
	if got := ix.Uncovered(tp0, 10, 20); len(got) != 0 {
		t.Fatalf("Uncovered(10, 20) = %v, want none: a committed marker covers it", got)
	}
	if ix.Skipped() != 0 {
		t.Fatalf("Skipped = %d: the watermark was not recognised", ix.Skipped())
	}
}
