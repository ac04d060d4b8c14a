package sessions_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/sessions"
	"github.com/weirstream/weir/internal/broker"
	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sources/sharegroup"
)

// errCrash is the failure the test injects once, so that the job restarts.
var errCrash = errors.New("test: the attempt fails")

// A consumer of the share group crashes holding the first clicks of the
// input (it acquired them and never acknowledges them: their locks lapse),
// and the job restarts. The restarted job reads the later clicks at once;
// the crashed consumer's clicks come back only once their locks lapsed,
// behind clicks newer than them by far more than the out-of-orderness. The
// input is out of order by less than the bound only, so by the contract no
// click is late: the restarted source holds its watermark back until the
// records in flight at the failure can have come back, and read_committed
// "sessions" holds exactly the sessions of the input, each once, and
// "late-clicks" nothing.
func TestClicksRedeliveredAfterACrashedConsumersLocksLapseAreNotLate(t *testing.T) {
	env := kafkatest.New(t, broker.Config("group.share.record.lock.duration.ms", "4000"),
		broker.Config("share.record.lock.sweep.interval.ms", "200"))
	env.CreateTopic(t, "clicks", 1, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	cs := onTimeClicks(t)
	clock := click{"clock", cs[len(cs)-1].ts + 10*gap}
	cs = append(cs, clock)
	var recs []*kgo.Record
	for _, c := range cs {
		recs = append(recs, c.record("clicks"))
	}
	produce(t, env, recs...)
	var wantOut []string
	for _, s := range expectedSessions(cs) {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		wantOut = append(wantOut, key([]byte(s.User), b))
	}

	// The crashed consumer: a member of the group that acquires the first
	// 30 clicks and then neither acknowledges nor renews them.
	for k, v := range map[string]string{sharegroup.IsolationLevelConfig: "read_committed", "share.auto.offset.reset": "earliest"} {
		if err := sharegroup.SetGroupConfig(ctx, env.Client(t), "sessions", k, v); err != nil {
			t.Fatal(err)
		}
	}
	crashed := env.Client(t, kgo.ShareGroup("sessions"), kgo.ConsumeTopics("clicks"),
		kgo.ShareMaxRecords(30), kgo.ShareMaxRecordsStrict())
	held, acquired := 0, time.Now()
	for held == 0 {
		fs := crashed.PollRecords(ctx, 30)
		if err := ctx.Err(); err != nil {
			t.Fatal(err)
		}
		held = fs.NumRecords()
	}

	reg := runtime.NewRegistry()
	if err := sessions.Register(reg); err != nil {
		t.Fatal(err)
	}
	job, err := reg.Build(sessions.Name, map[string]string{"brokers": env.Addr, "parallelism": "2",
		"idle": "1s"}) // a subtask that gets no click does not hold the watermark for long
	if err != nil {
		t.Fatal(err)
	}
	// The first attempt fails at its first pre-commit: the job restarts,
	// as after the crash of the process the consumer above stands for.
	var failed atomic.Bool
	fp := failpoint.New(failpoint.WithHook(failpoint.SinkAfterPrecommit, func() error {
		if failed.CompareAndSwap(false, true) {
			return errCrash
		}
		return nil
	}))
	jctx, stopJob := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := runtime.NewMiniCluster(runtime.CheckpointInterval(100*time.Millisecond),
			runtime.Restarts(10, 100*time.Millisecond), runtime.Failpoints(fp)).Run(jctx, job)
		done <- err
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			stopJob()
			<-done
		}
	}
	defer stop()
	// Wait for every session, and for the crashed consumer's clicks to come
	// back (lock 4 s, sweep 0.2 s) and be processed, wherever they go; or
	// for a late click, which fails the test below.
	for deadline := time.Now().Add(2 * time.Minute); ; {
		out, _ := kafkatest.ReadCommitted(ctx, []string{env.Addr}, "sessions")
		late, _ := kafkatest.ReadCommitted(ctx, []string{env.Addr}, "late-clicks")
		if len(late) > 0 || len(out) >= len(wantOut) && time.Since(acquired) > 8*time.Second || time.Now().After(deadline) {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("job ended early: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	stop()
	if !failed.Load() {
		t.Fatal("the job never restarted")
	}

	requireExactly(t, "sessions", env.ReadCommitted(t, "sessions"), wantOut)
	requireExactly(t, "late-clicks", env.ReadCommitted(t, "late-clicks"), nil)
	if !t.Failed() {
		t.Logf("%d clicks, %d held by the crashed consumer, %d sessions each once, no late click", len(cs), held, len(wantOut))
	}
}
