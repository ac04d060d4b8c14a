package acklog

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// modelMarker is the brute-force view of one marker.
type modelMarker struct {
	e    Entry
	pid  int64
	gone bool
}

// randomIndex fills an Index (no client) with n random markers over a few
// partitions and producers, resolves most transactions, forgets some, and
// returns the brute-force model alongside.
func randomIndex(rng *rand.Rand, n int) (*Index, []*modelMarker) {
	ix := newIndex("t")
	tps := []TopicPartition{tp0, {"input", 1}, {"other", 0}}
	var model []*modelMarker
	for off := range int64(n) {
		pid := rng.Int64N(8)
		offs := make(map[TopicPartition][]int64)
		for range 1 + rng.IntN(3) {
			tp := tps[rng.IntN(len(tps))]
			base := rng.Int64N(1000)
			for range 1 + rng.IntN(30) {
				offs[tp] = append(offs[tp], base+rng.Int64N(40))
			}
		}
		m := Marker{ProducerID: pid, Checkpoint: uint64(off), Ranges: RangesOf(offs)}
		ix.mu.Lock()
		ix.add(m, off, fmt.Sprint(off), time.Time{}, Open, pid, 0)
		ix.mu.Unlock()
		model = append(model, &modelMarker{e: Entry{Marker: m, Offset: off, Status: Open}, pid: pid})

		switch r := rng.IntN(10); {
		case r < 3: // the producer ends its transaction
			st := Committed
			if r == 0 {
				st = Aborted
			}
			ix.mu.Lock()
			ix.resolve(pid, st)
			ix.mu.Unlock()
			for _, mm := range model {
				if mm.pid == pid && mm.e.Status == Open && !mm.gone {
					mm.e.Status = st
				}
			}
		case r == 3 && len(model) > 1: // a resolved marker is tombstoned
			mm := model[rng.IntN(len(model))]
			if mm.e.Status != Open && !mm.gone {
				ix.mu.Lock()
				ix.forget(fmt.Sprint(mm.e.Offset))
				ix.mu.Unlock()
				mm.gone = true
			}
		}
	}
	return ix, model
}

func TestIndexMatchesBruteForceModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	ix, model := randomIndex(rng, 600)
	live := func(mm *modelMarker) bool { return !mm.gone && mm.e.Status != Aborted }

	for _, tp := range []TopicPartition{tp0, {"input", 1}, {"other", 0}, {"none", 0}} {
		for off := int64(-2); off < 1045; off++ {
			var want *modelMarker
			for _, mm := range model {
				if !live(mm) || !mm.e.Marker.Covers(tp, off) {
					continue
				}
				if want == nil || (mm.e.Status == Committed && want.e.Status != Committed) {
					want = mm
				}
			}
			got, ok := ix.Lookup(tp, off)
			switch {
			case want == nil && ok:
				t.Fatalf("Lookup(%v, %d) = offset %d, want none", tp, off, got.Offset)
			case want != nil && (!ok || got.Offset != want.e.Offset || got.Status != want.e.Status):
				t.Fatalf("Lookup(%v, %d) = %d %v (%v), want %d %v", tp, off, got.Offset, got.Status, ok, want.e.Offset, want.e.Status)
			}
		}
	}
	for _, own := range model {
		var want []int64
		for _, mm := range model {
			if live(mm) && mm.e.Offset < own.e.Offset && mm.e.Marker.Overlaps(own.e.Marker) { // every marker is its own transaction
				want = append(want, mm.e.Offset)
			}
		}
		if got := offsetsOf(ix.Conflicts(own.e)); !slices.Equal(got, want) {
			t.Fatalf("Conflicts(%d) = %v, want %v", own.e.Offset, got, want)
		}
	}
	var wantLen int
	for _, mm := range model {
		if !mm.gone {
			wantLen++
		}
		got, ok := ix.Status(mm.e.Offset)
		if ok == mm.gone || (ok && got.Status != mm.e.Status) {
			t.Fatalf("Status(%d) = %v %v, want %v gone=%v", mm.e.Offset, got.Status, ok, mm.e.Status, mm.gone)
		}
	}
	if ix.Len() != wantLen {
		t.Fatalf("Len = %d, want %d", ix.Len(), wantLen)
	}
}

func BenchmarkLookup(b *testing.B) {
	// 10k markers of ~2000 offsets each, contiguous as a share partition
	// hands them out, all committed.
	ix := newIndex("t")
	for i := range int64(10000) {
		m := Marker{ProducerID: i % 16, Ranges: map[TopicPartition][]Range{tp0: {{i * 2000, (i + 1) * 2000}}}}
		ix.add(m, i, fmt.Sprint(i), time.Time{}, Committed, i%16, 0)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	b.ResetTimer()
	for b.Loop() {
		if _, ok := ix.Lookup(tp0, rng.Int64N(10000*2000)); !ok {
			b.Fatal("miss")
		}
	}
}

func TestLookupFindsTheLastOffsetOfTheLongestRange(t *testing.T) {
	ix := newIndex("t")
	long := Marker{ProducerID: 1, Ranges: map[TopicPartition][]Range{tp0: {{0, 10}}}}
	short := Marker{ProducerID: 2, Ranges: map[TopicPartition][]Range{tp0: {{12, 14}}}}
	ix.add(long, 0, "long", time.Time{}, Committed, 1, 0)
	ix.add(short, 1, "short", time.Time{}, Open, 2, 0)
	tests := []struct {
		off  int64
		want int64 // -1: none
	}{{-1, -1}, {0, 0}, {9, 0}, {10, -1}, {11, -1}, {12, 1}, {13, 1}, {14, -1}}
	for _, tt := range tests {
		got, ok := ix.Lookup(tp0, tt.off)
		if (tt.want < 0) == ok || (ok && got.Offset != tt.want) {
			t.Errorf("Lookup(%d) = %d, %v; want %d", tt.off, got.Offset, ok, tt.want)
		}
	}
	own := Entry{Offset: 5, Marker: Marker{ProducerID: 3, Ranges: map[TopicPartition][]Range{tp0: {{9, 10}, {13, 20}}}}}
	if got := offsetsOf(ix.Conflicts(own)); !slices.Equal(got, []int64{0, 1}) {
		t.Errorf("Conflicts on the edges = %v, want [0 1]", got)
	}
	own.Marker.Ranges = map[TopicPartition][]Range{tp0: {{10, 12}, {14, 20}}}
	if got := ix.Conflicts(own); len(got) != 0 {
		t.Errorf("Conflicts touching the edges = %v, want none", offsetsOf(got))
	}
}
