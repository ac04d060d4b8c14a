package sessions_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
//
// Cases: one partition, clicks produced plainly; four partitions (two
// lanes per source subtask, the default), clicks written in transactions of
// 20 with an aborted transaction of clicks of "ghost" users after each,
// which must never count.
func TestClicksRedeliveredAfterACrashedConsumersLocksLapseAreNotLate(t *testing.T) {
	for _, tc := range []struct {
		name       string
		partitions int32
		txns       bool
	}{
		{"one-partition", 1, false},
		{"four-partitions-transactional-input-with-aborts", 4, true},
	} {
		t.Run(tc.name, func(t *testing.T) { redeliveredAfterACrash(t, tc.partitions, tc.txns) })
	}
}

func redeliveredAfterACrash(t *testing.T, partitions int32, txns bool) {
	// The lock is long enough for the job to start and restart before the
	// crashed consumer's clicks come back, even on a loaded machine.
	const lock = 10 * time.Second
	env := kafkatest.New(t, broker.Config("group.share.record.lock.duration.ms", fmt.Sprint(lock.Milliseconds())),
		broker.Config("share.record.lock.sweep.interval.ms", "200"))
	env.CreateTopic(t, "clicks", partitions, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	cs := onTimeClicks(t)
	clock := click{"clock", cs[len(cs)-1].ts + 10*gap}
	cs = append(cs, clock)
	var recs []*kgo.Record
	for _, c := range cs {
		recs = append(recs, c.record("clicks")) // keyed by user: spread over the partitions
	}
	if !txns {
		produce(t, env, recs...)
	}
	for i := 0; txns && i < len(recs); i += 20 {
		chunk := recs[i:min(i+20, len(recs))]
		env.WriteTxn(t, "clicks-committer", true, chunk...)
		var ghosts []*kgo.Record
		for k := range chunk {
			ghosts = append(ghosts, click{fmt.Sprintf("ghost%d", k%3), cs[i+k].ts}.record("clicks"))
		}
		env.WriteTxn(t, "clicks-aborter", false, ghosts...)
	}
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
	var failedAfter atomic.Int64 // since the acquisition
	fp := failpoint.New(failpoint.WithHook(failpoint.SinkAfterPrecommit, func() error {
		if failed.CompareAndSwap(false, true) {
			failedAfter.Store(int64(time.Since(acquired)))
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
	// back (lock, sweep 0.2 s) and be processed, wherever they go; or
	// for a late click, which fails the test below.
	for deadline := time.Now().Add(2 * time.Minute); ; {
		out, _ := kafkatest.ReadCommitted(ctx, []string{env.Addr}, "sessions")
		late, _ := kafkatest.ReadCommitted(ctx, []string{env.Addr}, "late-clicks")
		if len(late) > 0 || len(out) >= len(wantOut) && time.Since(acquired) > lock+5*time.Second || time.Now().After(deadline) {
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
		t.Logf("%d clicks, %d held by the crashed consumer, the job restarted %v after they were acquired (lock %v): %d sessions each once, no late click",
			len(cs), held, time.Duration(failedAfter.Load()).Round(time.Millisecond), lock, len(wantOut))
	}
}
