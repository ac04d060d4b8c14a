package runtime

import (
	"slices"
	"testing"
)

// testWriter is an output writer of ints on an edge of kind into par
// channels, with batches of size records, as a task wires one.
func testWriter(t *testing.T, kind edgeKind, par, maxPar, size int) (*outWriter[int], []chan envelope, *recordTime) {
	t.Helper()
	chans := make([]chan envelope, par)
	for i := range chans {
		chans[i] = make(chan envelope, 64)
	}
	now := &recordTime{ts: NoTimestamp}
	e := &edge{kind: kind}
	if kind == edgeHash {
		e.keyGroup = func(v int) int { return v % maxPar }
	}
	tw := &taskWiring{ctx: t.Context(), batchSize: size, maxPar: maxPar, stats: &taskStats{}, now: now}
	return newOutWriter[int](tw, chans, e, 0), chans, now
}

// received is what a channel carried: each record with its timestamp and
// key group (-1 on an edge without key groups), and whether a batch had
// timestamps stored.
type received struct {
	v, kg int
	ts    int64
}

func drain(t *testing.T, ch chan envelope) (rs []received, stored []bool) {
	t.Helper()
	for len(ch) > 0 {
		b := (<-ch).batch.(*batch[int])
		stored = append(stored, len(b.ts) > 0)
		for i, v := range b.vs {
			kg := -1
			if len(b.kgs) > 0 {
				kg = int(b.kgs[i])
			}
			rs = append(rs, received{v: v, kg: kg, ts: b.timestamp(i)})
		}
	}
	return rs, stored
}

func TestBatchesOfRecordsWithoutTimestampsStoreNone(t *testing.T) {
	for _, kind := range []edgeKind{edgeHash, edgeForward} {
		w, chans, _ := testWriter(t, kind, 1, 8, 4)
		for v := range 10 {
			if err := w.push(v); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.flush(t.Context()); err != nil {
			t.Fatal(err)
		}
		rs, stored := drain(t, chans[0])
		if len(rs) != 10 {
			t.Fatalf("edge %v: %d records, want 10", kind, len(rs))
		}
		for _, r := range rs {
			if r.ts != NoTimestamp {
				t.Errorf("edge %v: record %d has timestamp %d, want none", kind, r.v, r.ts)
			}
		}
		if slices.Contains(stored, true) {
			t.Errorf("edge %v: batches stored timestamps %v for records without any", kind, stored)
		}
	}
}

func TestBatchesDeliverEachRecordsOwnTimestamp(t *testing.T) {
	cases := []struct {
		name string
		ts   []int64 // per record; the batch size is 4
	}{
		{"first without, then with", []int64{NoTimestamp, NoTimestamp, 7, NoTimestamp, NoTimestamp, 9}},
		{"first with, then without", []int64{3, NoTimestamp, NoTimestamp, 4, 5, NoTimestamp}},
		{"all with", []int64{1, 2, 3, 4, 5, 6}},
		{"only the last of a full batch", []int64{NoTimestamp, NoTimestamp, NoTimestamp, 8, NoTimestamp}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, kind := range []edgeKind{edgeHash, edgeForward} {
				w, chans, now := testWriter(t, kind, 1, 8, 4)
				for v, ts := range c.ts {
					now.ts = ts
					if err := w.push(v); err != nil {
						t.Fatal(err)
					}
				}
				if err := w.flush(t.Context()); err != nil {
					t.Fatal(err)
				}
				rs, _ := drain(t, chans[0])
				if len(rs) != len(c.ts) {
					t.Fatalf("edge %v: %d records, want %d", kind, len(rs), len(c.ts))
				}
				for i, r := range rs {
					if r.v != i || r.ts != c.ts[i] {
						t.Errorf("edge %v: record %d: got value %d timestamp %d, want value %d timestamp %d", kind, i, r.v, r.ts, i, c.ts[i])
					}
				}
			}
		})
	}
}

func TestHashEdgeRoutesEveryKeyGroupToItsSubtask(t *testing.T) {
	for _, c := range []struct{ par, maxPar int }{{1, 8}, {2, 128}, {3, 128}, {5, 7}, {7, 7}} {
		w, chans, _ := testWriter(t, edgeHash, c.par, c.maxPar, 1000)
		for v := range c.maxPar {
			if err := w.push(v); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.flush(t.Context()); err != nil {
			t.Fatal(err)
		}
		got := 0
		for sub, ch := range chans {
			rs, _ := drain(t, ch)
			for _, r := range rs {
				got++
				if want := SubtaskOf(r.kg, c.maxPar, c.par); want != sub || r.kg != r.v%c.maxPar {
					t.Errorf("par %d max %d: record %d (key group %d) went to subtask %d, want %d", c.par, c.maxPar, r.v, r.kg, sub, want)
				}
			}
		}
		if got != c.maxPar {
			t.Errorf("par %d max %d: %d records delivered, want %d", c.par, c.maxPar, got, c.maxPar)
		}
	}
}

func TestBatchDecodedFromAnExchangeKeepsTimestamps(t *testing.T) {
	var edges []*edge
	j := NewJob("j")
	s := FromSource(j, "src", SliceSource([]int{1}, 1))
	Map(s, "m", func(v int) (int, error) { return v, nil })
	for _, n := range j.nodes {
		edges = append(edges, n.inputs...)
	}
	if len(edges) == 0 || edges[0].encode == nil {
		t.Fatal("no edge with a codec")
	}
	e := edges[0]
	for _, ts := range [][]int64{{NoTimestamp, NoTimestamp}, {NoTimestamp, 5}} {
		in := &batch[int]{}
		for i, x := range ts {
			in.vs = append(in.vs, i+1)
			in.stamp(x)
		}
		msg := e.encode(nil, in)
		out, err := e.decode(msg[0], msg[1:])
		if err != nil {
			t.Fatal(err)
		}
		b := out.(*batch[int])
		for i := range b.vs {
			if b.timestamp(i) != ts[i] {
				t.Errorf("timestamps %v: record %d decoded with %d", ts, i, b.timestamp(i))
			}
		}
		if want := ts[1] != NoTimestamp; (len(b.ts) > 0) != want {
			t.Errorf("timestamps %v: decoded batch stores timestamps: %v, want %v", ts, len(b.ts) > 0, want)
		}
	}
}
