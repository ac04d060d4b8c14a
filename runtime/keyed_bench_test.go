package runtime

import (
	"context"
	"fmt"
	"math/rand"
	"testing"

	"go.uber.org/zap"
)

// benchCount is the keyed count path's output (examples/wordcount's Count).
type benchCount struct {
	Word  string
	Count int64
}

// benchCounter is examples/wordcount's counter: a running count per word
// in a ValueState[int64], emitted for every occurrence.
type benchCounter struct{ n *ValueState[int64] }

func (c *benchCounter) Open(_ context.Context, st *StateRegistry[string]) (err error) {
	c.n, err = NewValueState[int64](st, "count", nil)
	return err
}

func (c *benchCounter) Process(w string, _ string, out Collector[benchCount]) error {
	n, _ := c.n.Value()
	n++
	c.n.Update(n)
	out.Collect(benchCount{Word: w, Count: n})
	return nil
}

// BenchmarkKeyedCount measures runtime-wordcount's count side per record:
// a keyed operator (parallelism 1, 128 key groups) running the wordcount
// counter on words of a Zipf(1.1) vocabulary of 20000 (the bench corpus's),
// delivered with their key groups as a hash edge's batches are, into a
// sink that counts. ns/op is one record.
func BenchmarkKeyedCount(b *testing.B) {
	const maxPar = 128
	r := rand.New(rand.NewSource(1))
	z := rand.NewZipf(r, 1.1, 1, 20000-1)
	words := make([]string, 1<<16)
	kgs := make([]int, len(words))
	for i := range words {
		words[i] = fmt.Sprintf("w%x", z.Uint64()*2654435761%1000003)
		kgs[i] = int(hashString(words[i]) % maxPar)
	}
	ks := &KeyedStream[string, string]{codec: StringCodec(), key: func(w string) string { return w }}
	oc := &OperatorContext{Job: "bench", Name: "count", UID: "count", Parallelism: 1, Logger: zap.NewNop(),
		RequestCheckpoint: func(string) {}, now: &recordTime{ts: NoTimestamp}, sides: map[string]any{}}
	var seen int64
	k := newKeyedInstance("count", ks, keyedFunction[string, string, benchCount]{fn: &benchCounter{}}, keyHasher(StringCodec()), maxPar, oc,
		pushFn[benchCount](func(benchCount) error { seen++; return nil }))
	if err := k.open(b.Context()); err != nil {
		b.Fatal(err)
	}
	push := k.inputWithKeyGroup().(func(string, int) error)
	i := 0
	for b.Loop() {
		j := i & (len(words) - 1)
		if err := push(words[j], kgs[j]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	if seen != int64(i) {
		b.Fatalf("the sink saw %d records of %d", seen, i)
	}
}
