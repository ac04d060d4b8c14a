package sessions_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/sessions"
	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
)

// At volume a share fetch hands a subtask a batch spanning many seconds of
// event time, often from one partition; a watermark made from what each
// subtask saw passed records of partitions nobody had fetched yet (issue
// 36: 81,196 of 222,271 clicks late). The watermark follows the group's
// frontier instead: with every click produced in event-time order within
// 2 s (the bound is 5 s) and the whole input waiting as a backlog, no click
// is late and every session the contract expects is emitted once,
// read_committed, for several partition counts, parallelisms and fetch
// sizes (a broker cap of 200 in-flight records per partition clips every
// fetch to 200). The same holds on the partition source (source=kafka: a
// watermark per partition, no hold-back). WEIR_VOLUME=1 runs the full size
// (3000 users, about 220k clicks) over the full matrix; .ci/run does,
// without the race detector.
func TestSessionsAtVolumeHaveNoLateClickAndEverySessionOnce(t *testing.T) {
	type tc struct {
		users, partitions, parallelism, cap int
		source                              string
	}
	cases := []tc{{users: 600, partitions: 4, parallelism: 2}, {users: 400, partitions: 16, parallelism: 3, cap: 200},
		{users: 600, partitions: 4, parallelism: 3, source: "kafka"}}
	if os.Getenv("WEIR_VOLUME") != "" {
		cases = []tc{{3000, 4, 1, 0, ""}, {3000, 4, 4, 200, ""}, {3000, 16, 2, 200, ""}, {3000, 16, 3, 0, ""}, {3000, 16, 3, 0, "kafka"}}
	}
	for _, c := range cases {
		name := fmt.Sprintf("users=%d/partitions=%d/parallelism=%d/cap=%d", c.users, c.partitions, c.parallelism, c.cap)
		if c.source != "" {
			name += "/source=" + c.source
		}
		t.Run(name, func(t *testing.T) {
			var opts []broker.Opt
			if c.cap > 0 {
				opts = append(opts, broker.Config("group.share.partition.max.record.locks", strconv.Itoa(c.cap)))
			}
			env := kafkatest.New(t, opts...)
			env.CreateTopic(t, "clicks", int32(c.partitions), nil)
			cs := sessions.Generate(c.users, t0, 20*time.Minute, 2*time.Second, uint64(c.users*c.partitions))
			recs := make([]*kgo.Record, len(cs))
			for i, cl := range cs {
				recs[i] = cl.Record("clicks")
			}
			produce(t, env, recs...)
			want := sessions.Expected(cs, gap*time.Millisecond, ooo*time.Millisecond)
			wantOut := make([]string, len(want))
			for i, s := range want {
				b, err := json.Marshal(s)
				if err != nil {
					t.Fatal(err)
				}
				wantOut[i] = key([]byte(s.User), b)
			}
			reg := runtime.NewRegistry()
			if err := sessions.Register(reg); err != nil {
				t.Fatal(err)
			}
			job, err := reg.Build(sessions.Name, map[string]string{"brokers": env.Addr,
				"parallelism": strconv.Itoa(c.parallelism), "idle": "2s", "source": c.source})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			start := time.Now()
			go func() {
				_, err := runtime.NewMiniCluster(runtime.CheckpointInterval(100*time.Millisecond)).Run(ctx, job)
				done <- err
			}()
			waitFor(t, env, done, "sessions", len(want))
			took := time.Since(start)
			cancel()
			if err := <-done; err != nil && ctx.Err() == nil {
				t.Fatal(err)
			}
			late := env.ReadCommitted(t, "late-clicks")
			if len(late) > 0 {
				t.Errorf("%d of %d clicks late, all within the bound (first: %s)", len(late), len(cs), late[0].Value)
			}
			requireExactly(t, "sessions", env.ReadCommitted(t, "sessions"), wantOut)
			t.Logf("%d clicks, %d sessions each once, none late, in %v", len(cs), len(want), took.Round(time.Millisecond))
		})
	}
}
