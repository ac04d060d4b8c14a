package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
)

// BenchmarkBoundedRead measures the source alone: a bounded job at
// parallelism 2 reading 200k records of 8 partitions from the embedded
// broker into a sink that drops them, checkpointing every 100 ms.
func BenchmarkBoundedRead(b *testing.B) {
	env := kafkatest.New(b)
	env.CreateTopic(b, "in", 8, nil)
	const n = 200_000
	for i := 0; i < n; i += 50_000 {
		produceB(b, env, "in", 8, i, 50_000)
	}
	b.ResetTimer()
	for range b.N {
		src, err := New(decodeString, Brokers(env.Addr), Topics("in"), StopAt(Latest()))
		if err != nil {
			b.Fatal(err)
		}
		j := runtime.NewJob("bench", runtime.DefaultParallelism(2))
		runtime.SinkTo(runtime.FromSource(j, "source", src), "drop", runtime.SinkFunc(func(context.Context, string) error { return nil }))
		start := time.Now()
		if _, err := runtime.NewMiniCluster(runtime.CheckpointInterval(100*time.Millisecond)).Run(b.Context(), j); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(n)/time.Since(start).Seconds(), "records/s")
	}
}
