package kafka_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sources/kafka"
)

// A bounded job on the partition source: it reads the topic's partitions
// from the earliest offset up to the offsets they had when it started,
// with a watermark per partition, and FINISHES (its sinks commit). Restored
// from a savepoint, the same job reprocesses from the savepoint's offsets.
// An in-process broker stands in for a Kafka cluster; docs/guide/kafka.md
// quotes it.
func ExampleNew() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := broker.Start(ctx, broker.Listen("127.0.0.1:0"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.DefaultProduceTopic("lines"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 2, 1, nil, "lines"); err != nil {
		fmt.Println(err)
		return
	}
	if err := cl.ProduceSync(ctx, kgo.StringRecord("to be"), kgo.StringRecord("or not"), kgo.StringRecord("to be")).FirstErr(); err != nil {
		fmt.Println(err)
		return
	}

	j := runtime.NewJob("print-lines")
	src, err := kafka.New(func(r *kgo.Record) (string, error) { return string(r.Value), nil },
		kafka.Brokers(b.Addr()), kafka.Topics("lines"),
		kafka.Group("print-lines"),      // offsets committed here on checkpoint completion, for monitoring
		kafka.StartAt(kafka.Earliest()), // the default
		kafka.StopAt(kafka.Latest()))    // bounded: the job finishes
	if err != nil { // wraps kafka.ErrInvalidConfig
		fmt.Println(err)
		return
	}
	lines := runtime.FromSource(j, "lines", src, runtime.UID("lines"),
		runtime.Watermarks(runtime.ForBoundedOutOfOrderness[string](time.Second, runtime.WithIdleness(10*time.Second))))

	var mu sync.Mutex
	var got []string
	runtime.SinkTo(lines, "collect", runtime.SinkFunc(func(_ context.Context, line string) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, line)
		return nil
	}))
	if _, err := runtime.NewMiniCluster(runtime.CheckpointInterval(100*time.Millisecond)).Run(ctx, j); err != nil {
		fmt.Println("job did not finish:", err)
		return
	}
	slices.Sort(got)
	fmt.Println(strings.Join(got, " | "))
	// Output: or not | to be | to be
}
