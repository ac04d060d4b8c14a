package wordcount_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func corpus(n int) []string {
	words := strings.Fields("the quick brown fox jumps over the lazy dog and The DOG sleeps")
	lines := make([]string, n)
	for i := range lines {
		var b strings.Builder
		for k := 0; k < 1+i%7; k++ {
			fmt.Fprintf(&b, "%s ", words[(i*3+k*5)%len(words)])
		}
		fmt.Fprintf(&b, "w%d", i%50)
		lines[i] = b.String()
	}
	return lines
}

func produce(t *testing.T, env *kafkatest.Env, topic string, lines []string) {
	t.Helper()
	cl := env.Client(t, kgo.DefaultProduceTopic(topic))
	var recs []*kgo.Record
	for _, l := range lines {
		recs = append(recs, kgo.StringRecord(l))
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// runUntil runs the job until the output holds want's total count of
// records read_committed, then stops it.
func runUntil(t *testing.T, env *kafkatest.Env, job *runtime.Job, want map[string]int, opts ...runtime.ClusterOpt) runtime.Result {
	t.Helper()
	total := 0
	for _, n := range want {
		total += n
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	var res runtime.Result
	go func() {
		var err error
		res, err = runtime.NewMiniCluster(opts...).Run(ctx, job)
		done <- err
	}()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case err := <-done:
			t.Fatalf("job ended early: %v", err)
		case <-deadline:
			cancel()
			<-done
			t.Fatalf("output did not reach %d records in time (have %d)", total, len(env.ReadCommitted(t, "counts")))
		case <-time.After(200 * time.Millisecond):
		}
		if len(env.ReadCommitted(t, "counts")) >= total {
			break
		}
	}
	cancel()
	<-done
	return res
}

func TestWordcountExactlyOnceOnTheEmbeddedBroker(t *testing.T) {
	for _, guarantee := range []string{"exactly-once", "at-least-once"} {
		t.Run(guarantee, func(t *testing.T) {
			env := kafkatest.New(t)
			env.CreateTopic(t, "lines", 4, nil)
			lines := corpus(3000)
			produce(t, env, "lines", lines)
			reg := runtime.NewRegistry()
			if err := wordcount.Register(reg); err != nil {
				t.Fatal(err)
			}
			job, err := reg.Build("wordcount", map[string]string{"brokers": env.Addr, "guarantee": guarantee})
			if err != nil {
				t.Fatal(err)
			}
			want := wordcount.Expected(lines)
			runUntil(t, env, job, want, runtime.CheckpointInterval(50*time.Millisecond))
			rep := wordcount.Check(env.ReadCommitted(t, "counts"), want)
			if !rep.OK() {
				t.Fatal(rep)
			}
			t.Log(rep)
		})
	}
}
