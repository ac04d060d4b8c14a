package kafkatxn

import (
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/checkpoint"
)

// firstOffsets keeps the lowest offset of every partition, whatever the
// order and the goroutines the results come from, and take forgets them.
func TestFirstOffsetsKeepTheLowestOffsetPerPartition(t *testing.T) {
	var f firstOffsets
	type tp struct {
		topic string
		part  int32
	}
	want := map[tp]int64{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 2000 {
				k := tp{[]string{"a", "b", "c"}[r.IntN(3)], int32(r.IntN(9))}
				o := r.Int64N(1 << 20)
				f.note(k.topic, k.part, o)
				mu.Lock()
				if cur, ok := want[k]; !ok || o < cur {
					want[k] = o
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	got := f.take()
	if len(got) != len(want) {
		t.Fatalf("took %d partitions, want %d", len(got), len(want))
	}
	for i, p := range got {
		if i > 0 && (got[i-1].Topic > p.Topic || got[i-1].Topic == p.Topic && got[i-1].Partition >= p.Partition) {
			t.Fatalf("not sorted at %d: %+v", i, got)
		}
		if o := want[tp{p.Topic, p.Partition}]; p.FirstOffset != o {
			t.Errorf("%s[%d]: first offset %d, want %d", p.Topic, p.Partition, p.FirstOffset, o)
		}
	}
	if again := f.take(); len(again) != 0 {
		t.Fatalf("a second take returned %+v, want nothing", again)
	}
	f.note("b", 2, 7)
	f.note("b", 2, 9)
	if got, want := f.take(), []checkpoint.TxnPartition{{Topic: "b", Partition: 2, FirstOffset: 7}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after take: %+v, want %+v", got, want)
	}
}

// The clock never stamps later than now, and moves on once its period
// passed.
func TestStampClockIsCoarseButNeverAhead(t *testing.T) {
	var c stampClock
	defer c.stop()
	first := c.read()
	if first.After(time.Now()) {
		t.Fatalf("stamp %v is ahead of now", first)
	}
	deadline := time.Now().Add(10 * time.Second)
	for c.read().Equal(first) {
		if time.Now().After(deadline) {
			t.Fatal("the clock did not move in 10s")
		}
		time.Sleep(clockPeriod)
	}
	if s := c.read(); s.Before(first) || s.After(time.Now()) {
		t.Fatalf("stamp %v not in [%v, now]", s, first)
	}
}

// The task-owned writer (SingleGoroutine) writes exactly what the locking
// one does: records stamped when they have no timestamp (a given one is
// kept), first offsets in the handle, commit visible read_committed.
func TestSingleGoroutineWriterCommitsEpochs(t *testing.T) {
	ctx := testCtx(t)
	c := newCluster(t)
	addrs := c.ListenAddrs()
	w := newWriter(t, ctx, addrs, SingleGoroutine())
	defer w.Close()
	if err := w.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	given := time.UnixMilli(1_000_000)
	var recs []*kgo.Record
	for id := checkpoint.ID(1); id <= 3; id++ {
		before := time.Now().Add(-time.Second)
		for i := range 30 {
			r := &kgo.Record{Topic: testTopic, Partition: int32(i % testPartitions), Value: []byte{byte('a' + i%26)}}
			if i == 5 {
				r.Timestamp = given
			}
			if err := w.Write(ctx, r); err != nil {
				t.Fatal(err)
			}
			recs = append(recs, r)
		}
		h, ok, err := w.PreCommit(ctx, id)
		if err != nil || !ok {
			t.Fatalf("PreCommit %d: %v, %v", id, ok, err)
		}
		if len(h.Partitions) != testPartitions {
			t.Fatalf("handle of %d names partitions %+v, want all %d", id, h.Partitions, testPartitions)
		}
		for _, p := range h.Partitions {
			if want := int64(id-1) * (30/testPartitions + 1); p.FirstOffset != want { // +1: the commit marker
				t.Errorf("checkpoint %d: %s[%d] first offset %d, want %d", id, p.Topic, p.Partition, p.FirstOffset, want)
			}
		}
		if err := w.Commit(ctx, id); err != nil {
			t.Fatal(err)
		}
		for i, r := range recs[len(recs)-30:] {
			switch {
			case i == 5 && !r.Timestamp.Equal(given):
				t.Errorf("a given timestamp was replaced: %v", r.Timestamp)
			case i != 5 && (r.Timestamp.Before(before) || r.Timestamp.After(time.Now())):
				t.Errorf("record %d stamped %v, not within the write", i, r.Timestamp)
			}
		}
	}
	got := readCommitted(t, ctx, addrs)
	for p := range testPartitions {
		if len(got[p]) != 30 {
			t.Errorf("partition %d: %d committed records, want 30", p, len(got[p]))
		}
	}
}
