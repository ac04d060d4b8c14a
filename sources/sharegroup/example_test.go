package sharegroup_test

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
	"github.com/weirstream/weir/sources/sharegroup"
)

// A job reading a share group, exactly once (the default Transactional
// mode): each line is emitted once, and acknowledged to the broker only
// after the checkpoint that covers it completed. An in-process broker stands
// in for a Kafka cluster. The README quotes it.
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
	src, err := sharegroup.New(func(r *kgo.Record) (string, error) { return string(r.Value), nil },
		sharegroup.Brokers(b.Addr()), sharegroup.Topics("lines"), sharegroup.Group("wordcount"))
	if err != nil {
		fmt.Println(err)
		return
	}
	lines := runtime.FromSource(j, "lines", src)

	// The source never ends: stop the job once every line arrived.
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var mu sync.Mutex
	var got []string
	runtime.SinkTo(lines, "collect", runtime.SinkFunc(func(_ context.Context, line string) error {
		mu.Lock()
		defer mu.Unlock()
		if got = append(got, line); len(got) == 3 {
			stop()
		}
		return nil
	}))
	if _, err := runtime.NewMiniCluster(runtime.CheckpointInterval(100*time.Millisecond)).Run(runCtx, j); ctx.Err() != nil {
		fmt.Println("job did not finish:", err)
		return
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(got)
	fmt.Println(strings.Join(got, " | "))
	// Output: or not | to be | to be
}
