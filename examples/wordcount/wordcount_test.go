package wordcount_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sources/sharegroup"
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
// records read_committed and settled (if given) reports true, then stops it.
func runUntil(t *testing.T, env *kafkatest.Env, job *runtime.Job, want map[string]int, settled func() bool, opts ...runtime.ClusterOpt) runtime.Result {
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
			recs, err := kafkatest.ReadCommitted(context.Background(), []string{env.Addr}, "counts")
			t.Fatalf("output did not reach %d records in time: %d read_committed (%v), settled %v", total, len(recs), err, settled == nil || settled())
		case <-time.After(200 * time.Millisecond):
		}
		if settled == nil || settled() {
			// Errors are expected while a test restarts the broker.
			recs, err := kafkatest.ReadCommitted(context.Background(), []string{env.Addr}, "counts")
			if err == nil && len(recs) >= total {
				break
			}
		}
	}
	cancel()
	<-done
	return res
}

func TestWordcountExactlyOnceOnTheEmbeddedBroker(t *testing.T) {
	for _, tc := range []struct{ guarantee, parallelism string }{
		{"exactly-once", "1"}, {"exactly-once", "2"}, {"at-least-once", "1"},
	} {
		guarantee := tc.guarantee
		t.Run(guarantee+"/parallelism="+tc.parallelism, func(t *testing.T) {
			env := kafkatest.New(t)
			env.CreateTopic(t, "lines", 4, nil)
			lines := corpus(3000)
			produce(t, env, "lines", lines)
			reg := runtime.NewRegistry()
			if err := wordcount.Register(reg); err != nil {
				t.Fatal(err)
			}
			job, err := reg.Build("wordcount", map[string]string{"brokers": env.Addr, "guarantee": guarantee,
				"parallelism": tc.parallelism})
			if err != nil {
				t.Fatal(err)
			}
			want := wordcount.Expected(lines)
			runUntil(t, env, job, want, nil, runtime.CheckpointInterval(50*time.Millisecond))
			rep := wordcount.Check(env.ReadCommitted(t, "counts"), want)
			if !rep.OK() {
				t.Fatal(rep)
			}
			t.Log(rep)
		})
	}
}

// The KIP-1289 failure matrix on the in-process cluster: each failpoint
// fails its task once (the whole job restarts from the latest completed
// checkpoint), and the committed output must still be exactly-once.
func TestWordcountSurvivesAFailureAtEveryPoint(t *testing.T) {
	points := []string{
		"source.after-ack-precommit=error@2",    // acks in the transaction, before the checkpoint ack
		"source.after-ack-commit=error@1",       // ack-log committed, before the broker ACCEPT
		"sink.after-precommit=error@2",          // output pre-committed, before the checkpoint ack
		"sink.after-commit=error@1",             // output committed, before notify finished
		"jm.after-checkpoint-persisted=error@1", // first checkpoint stored, no notification: recovery commits it
		"task.process=error@5000",               // mid-epoch processing failure
	}
	// Each point also with CommitWhenIdle(1ms), which the benchmark uses,
	// and an interval the test never reaches: the input comes in bursts,
	// and each burst's tail is committed only because the input went quiet
	// (with the idle time 0, all six time out: no checkpoint completes in
	// the restarted attempt).
	for _, tc := range []struct {
		name           string
		interval, idle time.Duration
	}{
		{"interval", 30 * time.Millisecond, 0},
		{"commit-when-idle", 10 * time.Minute, time.Millisecond},
	} {
		for _, spec := range points {
			t.Run(spec+"/"+tc.name, func(t *testing.T) {
				survivesAFailureAt(t, spec, tc.interval, tc.idle)
			})
		}
	}
}

func survivesAFailureAt(t *testing.T, spec string, interval, idle time.Duration) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "lines", 4, nil)
	lines := corpus(4000)
	// The first burst before the job starts, the others while it runs,
	// through the failure and the recovery. The last burst waits for the
	// restart (at most restartWait, for a failure that needs it), so that
	// the restarted attempt always has input of its own: with
	// CommitWhenIdle and a slow start, the first attempt could otherwise
	// commit all of it, and the restarted one would have nothing to
	// checkpoint.
	const bursts, restartWait = 8, 5 * time.Second
	burst := func(i int) []string { return lines[i*len(lines)/bursts : (i+1)*len(lines)/bursts] }
	produce(t, env, "lines", burst(0))
	restarted := make(chan struct{})
	var restartOnce sync.Once
	cl := env.Client(t, kgo.DefaultProduceTopic("lines"))
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		for i := 1; i < bursts; i++ {
			time.Sleep(100 * time.Millisecond)
			if i == bursts-1 {
				select {
				case <-restarted:
				case <-time.After(restartWait):
				case <-t.Context().Done():
					return
				}
			}
			recs := make([]*kgo.Record, 0, len(burst(i)))
			for _, l := range burst(i) {
				recs = append(recs, kgo.StringRecord(l))
			}
			if err := cl.ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
				t.Errorf("burst %d: %v", i, err)
				return
			}
		}
	}()
	defer func() { <-produced }()
	job, err := wordcount.BuildWith(runtime.Params{"brokers": env.Addr, "input": "lines", "output": "counts",
		"group": "wc", "guarantee": "exactly-once", "parallelism": "2"}, sharegroup.CommitWhenIdle(idle))
	if err != nil {
		t.Fatal(err)
	}
	fp, err := failpoint.Parse(spec)
	if err != nil {
		t.Fatal(err)
	}
	want := wordcount.Expected(lines)
	name := strings.SplitN(spec, "=", 2)[0]
	// Run on until a checkpoint completed in the restarted attempt: its
	// recovery (commits of the failed attempt's pending transactions) is
	// done, and nothing written later can change the output checked.
	var attempt, completedAfterRestart atomic.Int32
	res := runUntil(t, env, job, want, func() bool { return completedAfterRestart.Load() >= 1 },
		// MinPause(0): with a 10-minute interval, only the source's
		// requests (CommitWhenIdle) make checkpoints.
		runtime.CheckpointInterval(interval), runtime.MinPause(0), runtime.Failpoints(fp), runtime.Restarts(5, 10*time.Millisecond),
		runtime.Logger(zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))),
		runtime.OnRestore(func(n int, _ checkpoint.ID) {
			attempt.Store(int32(n))
			if n >= 1 { // attempts count from 0
				restartOnce.Do(func() { close(restarted) })
			}
		}),
		runtime.OnCheckpointComplete(func(runtime.CheckpointEvent) {
			if attempt.Load() >= 1 {
				completedAfterRestart.Add(1)
			}
		}))
	if res.Restarts == 0 {
		t.Fatalf("failpoint %s was hit %d times, %d restarts: the failure was not exercised", name, fp.Hits(name), res.Restarts)
	}
	rep := wordcount.Check(env.ReadCommitted(t, "counts"), want)
	if !rep.OK() {
		t.Fatal(rep)
	}
	t.Logf("%s (restarts %d)", rep, res.Restarts)
}

// A broker restart (state persisted in its data dir) during the prepare
// phase: after the source wrote its ack marker into the checkpoint's
// transaction and before the checkpoint completes. Clients reconnect, the
// pending transactions survive the restart and commit, and output stays
// exactly-once.
func TestWordcountSurvivesABrokerRestartDuringPrepare(t *testing.T) {
	dir := t.TempDir()
	env := kafkatest.New(t, broker.DataDir(dir))
	env.CreateTopic(t, "lines", 4, nil)
	lines := corpus(4000)
	produce(t, env, "lines", lines)
	var restarted atomic.Bool
	var restartErr error
	var next *broker.Broker
	t.Cleanup(func() {
		if next != nil {
			next.Close()
		}
	})
	fp := failpoint.New(failpoint.WithHook(failpoint.SourceAfterAckPrecommit, func() error {
		if restarted.Swap(true) {
			return nil
		}
		if err := env.Broker.Close(); err != nil {
			restartErr = err
			return nil
		}
		next, restartErr = broker.Start(context.Background(), broker.Listen(env.Addr), broker.DataDir(dir))
		return nil
	}))
	job, err := wordcount.Build(runtime.Params{"brokers": env.Addr, "input": "lines", "output": "counts",
		"group": "wc", "guarantee": "exactly-once"})
	if err != nil {
		t.Fatal(err)
	}
	want := wordcount.Expected(lines)
	res := runUntil(t, env, job, want, restarted.Load, runtime.CheckpointInterval(30*time.Millisecond),
		runtime.Failpoints(fp), runtime.Restarts(5, 50*time.Millisecond))
	if restartErr != nil {
		t.Fatalf("broker restart: %v", restartErr)
	}
	rep := wordcount.Check(env.ReadCommitted(t, "counts"), want)
	if !rep.OK() {
		t.Fatal(rep)
	}
	t.Logf("%s (job restarts %d)", rep, res.Restarts)
}
