package weirtest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/weirtest"
)

func startKafka(t *testing.T, opts ...weirtest.KafkaOpt) *weirtest.Kafka {
	t.Helper()
	k, err := weirtest.StartKafka(t.Context(), opts...)
	must(t, err)
	t.Cleanup(func() {
		if err := k.Close(); err != nil {
			t.Errorf("close broker: %v", err)
		}
	})
	return k
}

func lines(from, to int) []string {
	words := strings.Fields("to be or not to be that is the question")
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("%s %s w%d", words[i%len(words)], words[(i*3)%len(words)], i%7))
	}
	return out
}

// The kit's failures, one after the other on one running wordcount, with
// input written between them (some of it in aborted transactions): a task
// failure, a restart of the job from its latest checkpoint, a broker
// restart. The committed output is still every word's running count
// 1..n, each once.
func TestAJobsOutputStaysExactlyOnceThroughEveryFailureTheKitInjects(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	k := startKafka(t)
	must(t, k.CreateTopic(ctx, "lines", 4, nil))
	job, err := wordcount.Build(runtime.Params{"brokers": k.Addr(), "input": "lines", "output": "counts", "group": "wc",
		"guarantee": "exactly-once", "parallelism": "2"})
	must(t, err)
	run, err := weirtest.StartJob(job, weirtest.WithClusterOpts(runtime.Restarts(10, 10*time.Millisecond)))
	must(t, err)
	stopped := false
	defer func() {
		if !stopped {
			_, _ = run.Stop()
		}
	}()

	var all []string
	batch := 0
	write := func() {
		t.Helper()
		in := lines(batch*200, (batch+1)*200)
		batch++
		must(t, k.ProduceValues(ctx, "lines", in...))
		all = append(all, in...)
		var recs []*kgo.Record
		for _, l := range lines(10_000, 10_050) {
			recs = append(recs, &kgo.Record{Value: []byte(l + " aborted")})
		}
		must(t, k.ProduceTxn(ctx, fmt.Sprintf("writer-%d", batch), false, "lines", recs...))
	}
	caughtUp := func(what string) {
		t.Helper()
		want := wordcount.Expected(all)
		total := 0
		for _, n := range want {
			total += n
		}
		if _, err := run.WaitCommitted(ctx, k, "counts", func(recs []*kgo.Record) bool { return len(recs) >= total }); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		// More checkpoints: nothing beyond the input may follow.
		must(t, run.WaitCheckpoints(ctx, 2))
		out, err := k.ReadCommitted(ctx, "counts")
		must(t, err)
		if err := weirtest.CheckRunningCounts(out, want); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	write()
	caughtUp("before any failure")
	run.FailNextRecord()
	write()
	must(t, run.WaitRestarts(ctx, 1))
	caughtUp("after a task failure")
	if s := run.Status(); s.Restarts < 1 || s.RestoredFrom == 0 {
		t.Fatalf("after FailNextRecord: %+v, want a restart from a checkpoint", s)
	}
	write()
	must(t, run.RestartJob(ctx))
	caughtUp("after a restart of the job")
	if s := run.Status(); s.Runs != 2 || s.RestoredFrom == 0 {
		t.Fatalf("after RestartJob: %+v, want a second run restored from a checkpoint", s)
	}
	write()
	must(t, k.RestartBroker(ctx))
	write()
	caughtUp("after a broker restart")
	t.Logf("%+v", run.Status())

	stopped = true
	if _, err := run.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	open, err := k.Unfinished(ctx, "counts")
	must(t, err)
	if len(open) > 0 {
		t.Fatalf("still open at the broker after Stop: %v", open)
	}
}

// A broker SIGKILLed while the wordcount runs, with input written before
// and after the kill (some in aborted transactions): the broker repairs
// what the crash lost at its start, the job recovers, and the committed
// output is every word's running count 1..n, each once.
func TestAJobsOutputStaysExactlyOnceThroughABrokerKill(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	k := startKafka(t, weirtest.BrokerInChildProcess())
	must(t, k.CreateTopic(ctx, "lines", 4, nil))
	job, err := wordcount.Build(runtime.Params{"brokers": k.Addr(), "input": "lines", "output": "counts", "group": "wc",
		"guarantee": "exactly-once", "parallelism": "2"})
	must(t, err)
	run, err := weirtest.StartJob(job, weirtest.WithClusterOpts(runtime.Restarts(50, 50*time.Millisecond)))
	must(t, err)
	defer func() {
		if _, err := run.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	}()
	in := lines(0, 400)
	must(t, k.ProduceValues(ctx, "lines", in[:200]...))
	must(t, k.ProduceTxn(ctx, "writer", false, "lines", &kgo.Record{Value: []byte("aborted words")}))
	must(t, run.WaitCheckpoints(ctx, 2))
	must(t, k.KillBroker(ctx))
	must(t, k.ProduceValues(ctx, "lines", in[200:]...))
	want := wordcount.Expected(in)
	total := 0
	for _, n := range want {
		total += n
	}
	if _, err := run.WaitCommitted(ctx, k, "counts", func(recs []*kgo.Record) bool { return len(recs) >= total }); err != nil {
		t.Fatal(err)
	}
	must(t, run.WaitCheckpoints(ctx, 2))
	out, err := k.ReadCommitted(ctx, "counts")
	must(t, err)
	if err := weirtest.CheckRunningCounts(out, want); err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", run.Status())
}

func TestKillBrokerNeedsTheBrokerInAChildProcess(t *testing.T) {
	k := startKafka(t)
	if err := k.KillBroker(t.Context()); err == nil {
		t.Fatal("KillBroker of an in-process broker succeeded")
	}
}

func TestWaitingEndsWithTheJobsFailure(t *testing.T) {
	j := runtime.NewJob("failing")
	in := runtime.FromSource(j, "in", runtime.SliceSource([]int{1, 2, 3}, 0))
	bad := runtime.Map(in, "bad", func(v int) (int, error) { return 0, errors.New("no good") })
	runtime.SinkTo(bad, "out", runtime.SinkFunc(func(context.Context, int) error { return nil }))
	run, err := weirtest.StartJob(j, weirtest.WithClusterOpts(runtime.Restarts(0, 0)))
	must(t, err)
	err = run.WaitCheckpoints(t.Context(), 1000)
	if err == nil || !strings.Contains(err.Error(), "no good") {
		t.Fatalf("waiting on a job that fails: %v, want its failure", err)
	}
	if _, err := run.Stop(); !errors.Is(err, runtime.ErrJobFailed) {
		t.Fatalf("Stop of a failed job: %v, want ErrJobFailed", err)
	}
}

func TestABoundedJobEndsByItself(t *testing.T) {
	j := runtime.NewJob("bounded")
	in := runtime.FromSource(j, "in", runtime.SliceSource([]int{1, 2, 3}, 0))
	runtime.SinkTo(in, "out", runtime.SinkFunc(func(context.Context, int) error { return nil }))
	run, err := weirtest.StartJob(j)
	must(t, err)
	if _, err := run.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := run.RestartJob(t.Context()); err == nil {
		t.Fatal("RestartJob of an ended job succeeded")
	}
}

func rec(key, value string, p int32, off int64) *kgo.Record {
	return &kgo.Record{Key: []byte(key), Value: []byte(value), Partition: p, Offset: off}
}

func TestCheckRunningCountsNamesEveryKindOfViolation(t *testing.T) {
	want := map[string]int{"a": 2, "b": 3}
	for _, tc := range []struct {
		name                   string
		recs                   []*kgo.Record
		dups, lost, unexpected int
	}{
		{"exactly once", []*kgo.Record{rec("a", "1", 0, 0), rec("b", "1", 1, 0), rec("a", "2", 0, 1), rec("b", "2", 1, 1), rec("b", "3", 1, 2)}, 0, 0, 0},
		{"a repeat", []*kgo.Record{rec("a", "1", 0, 0), rec("a", "1", 0, 1), rec("a", "2", 0, 2), rec("b", "1", 1, 0), rec("b", "2", 1, 1), rec("b", "3", 1, 2)}, 1, 0, 0},
		{"a gap", []*kgo.Record{rec("a", "2", 0, 0), rec("b", "1", 1, 0), rec("b", "2", 1, 1), rec("b", "3", 1, 2)}, 0, 1, 0},
		{"short at the end", []*kgo.Record{rec("a", "1", 0, 0), rec("a", "2", 0, 1), rec("b", "1", 1, 0)}, 0, 2, 0},
		{"beyond the input", []*kgo.Record{rec("a", "1", 0, 0), rec("a", "2", 0, 1), rec("a", "3", 0, 2), rec("b", "1", 1, 0), rec("b", "2", 1, 1), rec("b", "3", 1, 2)}, 1, 0, 0},
		{"a stranger", []*kgo.Record{rec("a", "1", 0, 0), rec("a", "2", 0, 1), rec("c", "1", 0, 2), rec("b", "1", 1, 0), rec("b", "2", 1, 1), rec("b", "3", 1, 2)}, 0, 0, 1},
		{"not a count", []*kgo.Record{rec("a", "1", 0, 0), rec("a", "x", 0, 1), rec("a", "2", 0, 2), rec("b", "1", 1, 0), rec("b", "2", 1, 1), rec("b", "3", 1, 2)}, 0, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := weirtest.CheckRunningCounts(tc.recs, want)
			checkViolation(t, err, tc.dups, tc.lost, tc.unexpected)
		})
	}
}

func TestCheckEachOnceNamesEveryKindOfViolation(t *testing.T) {
	want := []string{"x", "y", "z"}
	for _, tc := range []struct {
		name                   string
		got                    []string
		dups, lost, unexpected int
	}{
		{"each once, in any order", []string{"z", "x", "y"}, 0, 0, 0},
		{"a repeat", []string{"x", "y", "z", "y"}, 1, 0, 0},
		{"a loss", []string{"x", "z"}, 0, 1, 0},
		{"a stranger", []string{"x", "y", "z", "w"}, 0, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkViolation(t, weirtest.CheckEachOnce(tc.got, want), tc.dups, tc.lost, tc.unexpected)
		})
	}
}

func checkViolation(t *testing.T, err error, dups, lost, unexpected int) {
	t.Helper()
	if dups+lost+unexpected == 0 {
		if err != nil {
			t.Fatalf("a clean output: %v", err)
		}
		return
	}
	var v *weirtest.ExactlyOnceError
	if !errors.As(err, &v) {
		t.Fatalf("got %v, want an ExactlyOnceError", err)
	}
	if v.Duplicates != dups || v.Lost != lost || v.Unexpected != unexpected {
		t.Fatalf("got %d duplicates, %d lost, %d unexpected (%v); want %d, %d, %d", v.Duplicates, v.Lost, v.Unexpected, v, dups, lost, unexpected)
	}
}
