package broker_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/kafkatest"
)

// The embedded broker in Go code: start it on a free port with a data
// directory, talk Kafka to it with any client, and read a topic exactly as a
// read_committed consumer sees it. The README quotes it.
func ExampleStart() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir, err := os.MkdirTemp("", "weir-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)

	b, err := broker.Start(ctx, broker.Listen("127.0.0.1:0"), broker.DataDir(dir))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addr()), kgo.DefaultProduceTopic("greetings"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, "greetings"); err != nil {
		fmt.Println(err)
		return
	}
	if err := cl.ProduceSync(ctx, kgo.StringRecord("hello world"), kgo.StringRecord("hello weir")).FirstErr(); err != nil {
		fmt.Println(err)
		return
	}
	recs, err := kafkatest.ReadCommitted(ctx, []string{b.Addr()}, "greetings")

	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range recs {
		fmt.Printf("%d@%d %s\n", r.Partition, r.Offset, r.Value)
	}
	// Output:
	// 0@0 hello world
	// 0@1 hello weir
}
