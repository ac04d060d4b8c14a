package wordcount_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
)

// A job cancelled for good, mid-run, leaves no transaction open (sink
// output, ack markers): read_committed readers of every topic see up to the
// high watermark at once, not after the transaction timeout. What it
// committed is exactly its last completed checkpoint: a second run restored
// from that checkpoint (same checkpoint directory) completes the output
// exactly once.
func TestCancelledWordcountLeavesNoOpenTransaction(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "lines", 4, nil)
	lines := corpus(20000)
	produce(t, env, "lines", lines)
	reg := runtime.NewRegistry()
	if err := wordcount.Register(reg); err != nil {
		t.Fatal(err)
	}
	build := func() *runtime.Job {
		job, err := reg.Build("wordcount", map[string]string{"brokers": env.Addr, "parallelism": "2"})
		if err != nil {
			t.Fatal(err)
		}
		return job
	}

	// Warnings are logged: a transaction the cancel could not end is
	// logged by the operator that owns it.
	opts := []runtime.ClusterOpt{runtime.CheckpointInterval(50 * time.Millisecond), runtime.CheckpointDir(t.TempDir()),
		runtime.Logger(zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))}

	// First run: cancel once some output is committed, before all of it.
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := runtime.NewMiniCluster(opts...).Run(ctx, build())
		done <- err
	}()
	for deadline := time.Now().Add(60 * time.Second); ; {
		recs, err := kafkatest.ReadCommitted(t.Context(), []string{env.Addr}, "counts")
		if err == nil && len(recs) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no output committed within 60s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("a cancelled run reported success")
	}

	env.RequireNothingOpen(t, "counts", "__weir-acklog-wordcount")

	// Second run: the rest, exactly once overall.
	want := wordcount.Expected(lines)
	runUntil(t, env, build(), want, nil, opts...)
	if rep := wordcount.Check(env.ReadCommitted(t, "counts"), want); !rep.OK() {
		t.Fatal(rep)
	}
}
