package runtime_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/weirstream/weir/runtime"
)

// WordCount is a word and its running count.
type WordCount struct {
	Word  string
	Count int64
}

// A wordcount: split lines into words, key by word, keep a running count per
// word in keyed state, and emit every new count. The README quotes it.
func Example_wordcount() {
	ctx := context.Background()
	lines := []string{"To be or not to be", "that is the question", "to be"}
	var mu sync.Mutex
	final := map[string]int64{}
	mySink := runtime.SinkFunc(func(_ context.Context, c WordCount) error {
		mu.Lock()
		defer mu.Unlock()
		final[c.Word] = max(final[c.Word], c.Count)
		return nil
	})

	j := runtime.NewJob("wordcount", runtime.DefaultParallelism(2))
	text := runtime.FromSource(j, "lines", runtime.SliceSource(lines, 0))
	words := runtime.FlatMap(text, "split", func(line string, out runtime.Collector[WordCount]) error {
		for _, w := range strings.Fields(strings.ToLower(line)) {
			out.Collect(WordCount{Word: w, Count: 1})
		}
		return nil
	})
	byWord := runtime.KeyBy(words, func(c WordCount) string { return c.Word }, nil)
	counts := runtime.Reduce(byWord, "count", func(acc, c WordCount) (WordCount, error) {
		acc.Count += c.Count
		return acc, nil
	}, nil)
	runtime.SinkTo(counts, "out", mySink)
	_, err := runtime.NewMiniCluster(runtime.CheckpointInterval(100*time.Millisecond)).Run(ctx, j)

	if err != nil {
		fmt.Println("job failed:", err)
		return
	}
	var out []string
	for w, n := range final {
		out = append(out, fmt.Sprintf("%s=%d", w, n))
	}
	sort.Strings(out)
	fmt.Println(strings.Join(out, " "))
	// Output: be=3 is=1 not=1 or=1 question=1 that=1 the=1 to=3
}

// Keyed state in a process function: the first time each key is seen.
func ExampleProcess() {
	j := runtime.NewJob("first-seen")
	events := runtime.FromSource(j, "events", runtime.SliceSource([]string{"a", "b", "a", "c", "b"}, 0))
	keyed := runtime.KeyBy(events, func(s string) string { return s }, nil)
	firsts := runtime.Process(keyed, "dedupe", func() runtime.KeyedProcessFunction[string, string, string] {
		return &dedupe{}
	})
	var mu sync.Mutex
	var seen []string
	runtime.SinkTo(firsts, "collect", runtime.SinkFunc(func(_ context.Context, s string) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, s)
		return nil
	}))
	if _, err := runtime.NewMiniCluster().Run(context.Background(), j); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(seen)
	// Output: [a b c]
}

type dedupe struct {
	seen *runtime.ValueState[bool]
}

func (d *dedupe) Open(_ context.Context, st *runtime.StateRegistry[string]) (err error) {
	d.seen, err = runtime.NewValueState[bool](st, "seen", nil)
	return err
}

func (d *dedupe) Process(key string, v string, out runtime.Collector[string]) error {
	if _, ok := d.seen.Value(); !ok {
		d.seen.Update(true)
		out.Collect(v)
	}
	return nil
}
