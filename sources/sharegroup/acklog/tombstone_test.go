package acklog

import (
	"reflect"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// recordAt reads the ack-log up to its end and returns the data record at
// offset, nil if there is none.
func (f *fixture) recordAt(topic string, offset int64) *kgo.Record {
	f.t.Helper()
	cl := f.client(kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()), kgo.KeepControlRecords())
	end, err := f.admin().ListEndOffsets(testCtx(f.t), topic)
	if err != nil {
		f.t.Fatal(err)
	}
	lo, _ := end.Lookup(topic, 0)
	var found *kgo.Record
	for next := int64(0); next < lo.Offset-1; {
		fs := cl.PollFetches(testCtx(f.t))
		if err := fs.Err0(); err != nil {
			f.t.Fatal(err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			next = max(next, r.Offset)
			if r.Offset == offset {
				found = r
			}
		})
	}
	return found
}

func TestMarkerKeyReadsBackEveryFieldButTheRanges(t *testing.T) {
	tests := []Marker{
		{Group: "g", Member: "src#0/lane1", TransactionalID: "weir-job-src-0-3", ProducerID: 7, Checkpoint: 12,
			CreatedAt: time.Unix(0, 1_700_000_000_123_456_789)},
		{Group: "a/b c%", Member: "", TransactionalID: "x/y", ProducerID: -1, Checkpoint: 0},
	}
	for _, m := range tests {
		got, ok := markerOfKey(string(m.Key()))
		if !ok {
			t.Fatalf("markerOfKey(%q): not read", m.Key())
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("markerOfKey(%q) = %+v, want %+v", m.Key(), got, m)
		}
	}
	for _, k := range []string{"", "weir-ack-watermark/g/t/0", "weir-ack/g/m/t/notanumber/1/0", "weir-ack/g/m/t/1/2"} {
		if m, ok := markerOfKey(k); ok {
			t.Errorf("markerOfKey(%q) = %+v, want not a marker key", k, m)
		}
	}
}

// A tombstone names its marker's ack-log offset and outcome: an Index that
// keeps tombstoned markers lists the committed ones in CommittedAfter, also
// once compaction removed the markers' own records and only the
// tombstones are left.
func TestTombstonedCommittedMarkersAreStillListedWhenKept(t *testing.T) {
	f := newFixture(t)
	topic := f.ackTopic("acklog")
	a, b := f.writer(topic, "a"), f.writer(topic, "b")
	c1 := a.txn(Committed, 1, Range{0, 10})
	ab := b.txn(Aborted, 2, Range{10, 20})
	c2 := a.txn(Committed, 3, Range{10, 20})
	live := b.txn(Committed, 4, Range{20, 30})

	writer := f.index(topic)
	catchUpToEnd(t, writer)
	tombs := writer.Tombstones(map[TopicPartition]int64{tp0: 20}, time.Now(), -time.Minute)
	if len(tombs) != 3 {
		t.Fatalf("%d tombstones, want 3 (two committed markers below the start, one aborted)", len(tombs))
	}
	if err := f.client().ProduceSync(testCtx(t), tombs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	want := []int64{c1.Offset, c2.Offset, live.Offset}

	kept := func() *Index {
		ix := f.index(topic)
		ix.KeepTombstoned()
		catchUpToEnd(t, ix)
		return ix
	}
	if got := offsetsOf(kept().CommittedAfter(-1)); !reflect.DeepEqual(got, want) {
		t.Fatalf("kept, markers read: CommittedAfter(-1) = %v, want %v", got, want)
	}
	if got := offsetsOf(kept().CommittedAfter(c1.Offset)); !reflect.DeepEqual(got, want[1:]) {
		t.Fatalf("kept: CommittedAfter(%d) = %v, want %v", c1.Offset, got, want[1:])
	}
	plain := f.index(topic)
	catchUpToEnd(t, plain)
	if got := offsetsOf(plain.CommittedAfter(-1)); !reflect.DeepEqual(got, []int64{live.Offset}) {
		t.Fatalf("not kept: CommittedAfter(-1) = %v, want only the live marker %d", got, live.Offset)
	}

	// Compaction keeps the last batch: one more record, then compact.
	b.txn(Aborted, 5, Range{30, 40})
	f.c.Compact()
	for _, off := range want[:2] {
		if r := f.recordAt(topic, off); r != nil {
			t.Fatalf("compaction left the tombstoned marker at %d: %+v", off, r)
		}
	}
	ix := kept()
	got := ix.CommittedAfter(-1)
	if !reflect.DeepEqual(offsetsOf(got), want) {
		t.Fatalf("kept, after compaction: CommittedAfter(-1) = %v, want %v", offsetsOf(got), want)
	}
	if m := got[1].Marker; m.Checkpoint != 3 || m.TransactionalID != "a" || m.Group != "g" || m.ProducerID != a.pid {
		t.Fatalf("marker known from its tombstone: %+v, want checkpoint 3 of a", m)
	}
	if _, ok := ix.Status(ab.Offset); ok {
		t.Fatal("the aborted marker is still indexed")
	}
}
