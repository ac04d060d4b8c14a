package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
)

var errInjected = errors.New("injected failure")

// Exactly once from offsets in state: 120k records over 6 partitions,
// read by 3 subtasks into the transactional sink while tasks fail (an
// error before a record is written, and one right after a sink's commit,
// before the notification is done), the job restarting from its latest
// checkpoint each time. Every output record is checked: each input
// record exactly once, read_committed.
func TestExactlyOnceThroughTaskFailuresFromOffsetsInState(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 6, nil)
	env.CreateTopic(t, "out", 3, nil)
	const n = 120_000
	for i := 0; i < n; i += 20_000 {
		produce(t, env, "in", 6, i, 20_000, "r", nil)
	}
	var processed, commits, fired atomic.Int64
	fails := []int64{15_000, 50_000, 90_000}
	fp := failpoint.New(
		failpoint.WithHook(failpoint.TaskProcess, func() error {
			k := processed.Add(1)
			if k%200 == 0 { // slowed, so that checkpoints complete while input remains
				time.Sleep(time.Millisecond)
			}
			for _, f := range fails {
				if k == f {
					fired.Add(1)
					return fmt.Errorf("%w at record %d", errInjected, k)
				}
			}
			return nil
		}),
		failpoint.WithHook(failpoint.SinkAfterCommit, func() error {
			if commits.Add(1) == 3 {
				fired.Add(1)
				return fmt.Errorf("%w after a commit", errInjected)
			}
			return nil
		}))
	j := copyJob(t, env, "eos", "in", "out", 3, StopAt(Latest()), MaxPollRecords(500))
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	res, err := runtime.NewMiniCluster(runtime.CheckpointInterval(100*time.Millisecond), runtime.Failpoints(fp),
		runtime.Restarts(10, 50*time.Millisecond)).Run(ctx, j)
	if err != nil {
		t.Fatal(err)
	}
	if fired.Load() != 4 || res.Restarts < 1 {
		t.Fatalf("%d of 4 failures injected, %d restarts; want all 4 injected", fired.Load(), res.Restarts)
	}
	sameSet(t, values(t, env, "out"), names("r", 0, n))
}

// A chained job's input holds aborted transactions (an upstream job's
// rolled-back checkpoints) between committed ones, and a transaction still
// open when the job starts that commits later: the source reads
// read_committed, so no aborted record reaches the output and the late
// commit does.
func TestAbortedTransactionsInTheInputAreNeverRead(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 2, nil)
	env.CreateTopic(t, "out", 1, nil)
	recs := func(prefix string, n int) []*kgo.Record {
		var out []*kgo.Record
		for i := range n {
			out = append(out, &kgo.Record{Topic: "in", Partition: int32(i % 2), Value: []byte(fmt.Sprintf("%s%d", prefix, i))})
		}
		return out
	}
	var want []string
	for round := range 5 {
		env.WriteTxn(t, "upstream", true, recs(fmt.Sprintf("c%d-", round), 100)...)
		env.WriteTxn(t, "upstream", false, recs(fmt.Sprintf("a%d-", round), 100)...)
		want = append(want, names(fmt.Sprintf("c%d-", round), 0, 100)...)
	}
	end := env.OpenTxn(t, "late", recs("late-", 50)...)
	j := copyJob(t, env, "chained", "in", "out", 2)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := runtime.NewMiniCluster(runtime.CheckpointInterval(100*time.Millisecond)).Run(ctx, j)
		done <- err
	}()
	waitFor(t, time.Minute, "the committed records before the open transaction", func() bool {
		return len(values(t, env, "out")) >= len(want)
	})
	end(true)
	want = append(want, names("late-", 0, 50)...)
	waitFor(t, time.Minute, "every committed record in the output", func() bool { return len(values(t, env, "out")) >= len(want) })
	time.Sleep(300 * time.Millisecond) // a stray aborted record would show now
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	sameSet(t, values(t, env, "out"), want)
}

// savepointOf runs j until cond holds, then takes a savepoint (stopping
// the job if stop) and returns it.
func savepointWhen(t *testing.T, mc *runtime.MiniCluster, cond func() bool, stop bool) checkpoint.Completed {
	t.Helper()
	waitFor(t, 2*time.Minute, "the job's progress", cond)
	c, err := mc.TriggerSavepoint(t.Context(), stop, false, func(checkpoint.Completed) error { return nil })
	if err != nil {
		t.Fatalf("savepoint: %v", err)
	}
	return c
}

// Reprocessing and rescaling: a job at parallelism 2 takes savepoint s1
// after the first 3000 records and savepoint s2 (stopping) after 6000.
// Restoring s2 at parallelism 3 (every subtask learns every partition's
// offset: union state) with a bounded stop reads exactly the records
// written since, and finishes. Restoring the OLDER s1 at parallelism 1
// into another topic reprocesses exactly the records after s1's offsets,
// and finishes: a restore never depends on what the consumer group holds
// (the group was committed past s1 by then).
func TestRestoringSavepointsRescalesAndReprocessesFromTheirOffsets(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 5, nil)
	env.CreateTopic(t, "out", 1, nil)
	env.CreateTopic(t, "again", 1, nil)
	env.CreateTopic(t, "later", 1, nil)
	produce(t, env, "in", 5, 0, 3000, "r", nil)
	mc := runtime.NewMiniCluster(runtime.CheckpointInterval(100 * time.Millisecond))
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := mc.Run(ctx, copyJob(t, env, "reproc", "in", "out", 2))
		done <- err
	}()
	s1 := savepointWhen(t, mc, func() bool { return len(values(t, env, "out")) >= 3000 }, false)
	produce(t, env, "in", 5, 3000, 3000, "r", nil)
	s2 := savepointWhen(t, mc, func() bool { return len(values(t, env, "out")) >= 6000 }, true)
	if err := <-done; err != nil {
		t.Fatalf("stop with savepoint: %v", err)
	}
	sameSet(t, values(t, env, "out"), names("r", 0, 6000))
	produce(t, env, "in", 5, 6000, 1000, "r", nil)

	run := func(from checkpoint.Completed, out string, par int) {
		t.Helper()
		mc := runtime.NewMiniCluster(runtime.CheckpointInterval(100*time.Millisecond), runtime.StartFrom(from))
		if _, err := mc.Run(ctx, copyJob(t, env, "reproc", "in", out, par, StopAt(Latest()))); err != nil {
			t.Fatalf("restore of checkpoint %d at parallelism %d: %v", from.ID, par, err)
		}
	}
	run(s2, "later", 3)
	sameSet(t, values(t, env, "later"), names("r", 6000, 1000))
	run(s1, "again", 1)
	sameSet(t, values(t, env, "again"), names("r", 3000, 4000))
}

// A broker restart (its state persisted in its data directory) while a
// checkpoint is being prepared, after a sink pre-committed its
// transaction: the source's clients reconnect and resume at their
// positions (or the job restarts from its latest checkpoint's offsets),
// and the output stays exactly once.
func TestExactlyOnceThroughABrokerRestartDuringPrepare(t *testing.T) {
	dir := t.TempDir()
	env := kafkatest.New(t, broker.DataDir(dir))
	env.CreateTopic(t, "in", 4, nil)
	env.CreateTopic(t, "out", 2, nil)
	const n = 20_000
	produce(t, env, "in", 4, 0, n, "r", nil)
	var restarted atomic.Bool
	var restartErr error
	var next *broker.Broker
	t.Cleanup(func() {
		if next != nil {
			_ = next.Close()
		}
	})
	// Records are slowed (1 ms per 50) so that checkpoints are taken
	// while input remains; the restart comes at the first pre-commit
	// after a tenth of the input was written.
	var written atomic.Int64
	fp := failpoint.New(failpoint.WithHook(failpoint.TaskProcess, func() error {
		if written.Add(1)%50 == 0 {
			time.Sleep(time.Millisecond)
		}
		return nil
	}), failpoint.WithHook(failpoint.SinkAfterPrecommit, func() error {
		if written.Load() < n/10 || restarted.Swap(true) {
			return nil
		}
		if err := env.Broker.Close(); err != nil {
			restartErr = err
			return nil
		}
		next, restartErr = broker.Start(context.Background(), broker.Listen(env.Addr), broker.DataDir(dir))
		return nil
	}))
	j := copyJob(t, env, "restart", "in", "out", 2, StopAt(Latest()), MaxPollRecords(200))
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	res, err := runtime.NewMiniCluster(runtime.CheckpointInterval(50*time.Millisecond), runtime.Failpoints(fp),
		runtime.Restarts(10, 100*time.Millisecond)).Run(ctx, j)
	if err != nil {
		t.Fatal(err)
	}
	if restartErr != nil || !restarted.Load() {
		t.Fatalf("broker restart: %v (restarted %v)", restartErr, restarted.Load())
	}
	sameSet(t, values(t, env, "out"), names("r", 0, n))
	t.Logf("job restarts: %d", res.Restarts)
}
