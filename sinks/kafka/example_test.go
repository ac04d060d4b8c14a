package kafka_test

import (
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sinks/kafka"
)

// Count is a word and its running count.
type Count struct {
	Word  string
	Count int64
}

// An exactly-once sink writing each count to the topic counts, keyed by
// its word. docs/kafka-sink.md quotes it; it is compiled, not run (it
// needs a broker).
func ExampleNewSink() {
	j := runtime.NewJob("counts")
	counts := runtime.FromSource(j, "counts-in", runtime.SliceSource([]Count{{"to", 1}, {"be", 1}}, 1))

	sink, err := kafka.NewSink(func(c Count) (*kgo.Record, error) {
		return &kgo.Record{Topic: "counts", Key: []byte(c.Word), Value: strconv.AppendInt(nil, c.Count, 10)}, nil
	}, []kafka.Opt{
		kafka.Brokers("127.0.0.1:9092"),
		kafka.Guarantee(kafka.ExactlyOnce),         // the default
		kafka.TransactionTimeout(15 * time.Minute), // the default
	}, kafka.CheckpointTimeouts(time.Minute, 2*time.Minute)) // optional: lets the sink check the timeout rule
	if err != nil { // wraps kafka.ErrInvalidConfig
		fmt.Println(err)
		return
	}
	runtime.SinkTo(counts, "counts", sink)
}
