package runtime

import (
	"strconv"
	"testing"
)

// BenchmarkHashEdgePush measures an output writer's push on a hash edge
// (runtime-wordcount's split -> count edge: string records without
// timestamps, parallelism 2, 128 key groups, the mini cluster's batch
// size), the receiving side releasing every batch at once.
func BenchmarkHashEdgePush(b *testing.B) {
	words := make([]string, 4096)
	for i := range words {
		words[i] = "w" + strconv.Itoa(i*7919%20000)
	}
	const par, maxPar = 2, 128
	chans := make([]chan envelope, par)
	for i := range chans {
		chans[i] = make(chan envelope, defaultChannelCap)
	}
	e := &edge{kind: edgeHash, keyGroup: func(w string) int { return int(hashString(w) % maxPar) }}
	tw := &taskWiring{ctx: b.Context(), batchSize: defaultBatchSize, maxPar: maxPar, stats: &taskStats{}, now: &recordTime{ts: NoTimestamp}}
	w := newOutWriter[string](tw, chans, e, 0)
	done := make(chan struct{})
	for _, ch := range chans {
		go func() {
			for {
				select {
				case env := <-ch:
					env.batch.release()
				case <-done:
					return
				}
			}
		}()
	}
	defer close(done)
	i := 0
	for b.Loop() {
		if err := w.push(words[i&4095]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
