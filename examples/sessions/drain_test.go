package sessions_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/examples/sessions"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
)

// The sessions job stopped with a savepoint while sessions are open: with
// drain (Flink's stop-with-savepoint --drain) the sources stop reading and
// emit the final watermark before the savepoint's barrier, so every session
// of the input fires exactly once, committed with the savepoint, and the
// job ends FINISHED; without drain only the sessions the watermark had
// closed are in the output (the open ones are in the savepoint's state).
// Checked record by record, read_committed.
func TestStopWithDrainFiresEveryOpenSessionOnceBeforeTheJobFinishes(t *testing.T) {
	errWrite := errors.New("the savepoint directory cannot be written")
	for _, tc := range []struct {
		name string
		// drain: stop with drain; failWrite: the first drain savepoint's
		// directory cannot be written (the job fails over, since its
		// sources read no more, and is stopped with drain again).
		drain, failWrite bool
	}{
		{name: "drain", drain: true},
		{name: "no-drain"},
		{name: "drain-write-fails-then-drain", drain: true, failWrite: true},
	} {
		drain := tc.drain
		t.Run(tc.name, func(t *testing.T) {
			env := kafkatest.New(t)
			env.CreateTopic(t, "clicks", 1, nil)
			reg := runtime.NewRegistry()
			if err := sessions.Register(reg); err != nil {
				t.Fatal(err)
			}
			job, err := reg.Build(sessions.Name, map[string]string{"brokers": env.Addr, "parallelism": "1"})
			if err != nil {
				t.Fatal(err)
			}
			clicks := onTimeClicks(t)
			maxTS := int64(0)
			for _, c := range clicks {
				maxTS = max(maxTS, c.ts)
			}
			// The last click, ahead of the others, closes sessions no earlier click
			// closes (bob's, which ends 5.3 s after the latest click, while
			// cat's and dan's stay open): once they are out, every click was
			// read.
			clicks = append(clicks, click{"zed", maxTS + 3*ooo})
			var recs []*kgo.Record
			for _, c := range clicks {
				recs = append(recs, c.record("clicks"))
			}
			produce(t, env, recs...)
			closed := expectedSessions(clicks)
			if before := expectedSessions(clicks[:len(clicks)-1]); len(before) >= len(closed) {
				t.Fatalf("test data: the last click closes no session (%d before, %d after)", len(before), len(closed))
			}
			// Every session, as the final watermark fires them: the
			// contract's sessions under a watermark past every end.
			all := make([]sessions.Click, len(clicks))
			for i, c := range clicks {
				all[i] = sessions.Click{User: c.user, TS: c.ts}
			}
			every := sessions.Expected(all, gap*time.Millisecond, -gap*time.Millisecond)
			if len(every) <= len(closed) {
				t.Fatalf("test data: no session open at the stop (%d closed of %d)", len(closed), len(every))
			}

			mc := runtime.NewMiniCluster(runtime.CheckpointInterval(50 * time.Millisecond))
			done := make(chan error, 1)
			go func() {
				_, err := mc.Run(t.Context(), job)
				done <- err
			}()
			waitFor(t, env, done, "sessions", len(closed))
			if tc.failWrite {
				_, err := mc.TriggerSavepoint(t.Context(), true, true, func(checkpoint.Completed) error { return errWrite })
				if !errors.Is(err, errWrite) {
					t.Fatalf("stop with drain whose write fails: %v, want %v", err, errWrite)
				}
				// The job reads on after its failover: a new user's two
				// sessions, the first closed by the second's click.
				yan := []click{{"yan", maxTS + 100*gap}, {"yan", maxTS + 102*gap}}
				produce(t, env, yan[0].record("clicks"), yan[1].record("clicks"))
				for _, c := range yan {
					all = append(all, sessions.Click{User: c.user, TS: c.ts})
				}
				waitFor(t, env, done, "sessions", len(every)+1)
				every = sessions.Expected(all, gap*time.Millisecond, -gap*time.Millisecond)
			}
			var sp checkpoint.Completed
			c, err := stopWithSavepoint(t, mc, drain, func(c checkpoint.Completed) error { sp = c; return nil })
			if err != nil {
				t.Fatalf("stop with a savepoint (drain %v): %v", drain, err)
			}
			if c.ID == 0 || sp.ID != c.ID {
				t.Fatalf("stop returned checkpoint %d, wrote %d", c.ID, sp.ID)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("the stopped job: %v, want it FINISHED", err)
				}
			case <-time.After(2 * time.Minute):
				t.Fatal("the job did not end after its stop-with-savepoint")
			}

			want := closed
			if drain {
				want = every
			}
			var wantOut []string
			for _, s := range want {
				b, err := json.Marshal(s)
				if err != nil {
					t.Fatal(err)
				}
				wantOut = append(wantOut, key([]byte(s.User), b))
			}
			got, err := kafkatest.ReadCommitted(context.WithoutCancel(t.Context()), []string{env.Addr}, "sessions")
			if err != nil {
				t.Fatal(err)
			}
			requireExactly(t, "sessions", got, wantOut)
			t.Logf("drain %v: %d sessions committed (%d closed by the watermark, %d in the input)", drain, len(got), len(closed), len(every))
			if drain {
				return
			}
			// The open sessions are in the savepoint: a job started from
			// it and stopped with drain fires them, each once.
			job, err = reg.Build(sessions.Name, map[string]string{"brokers": env.Addr, "parallelism": "1"})
			if err != nil {
				t.Fatal(err)
			}
			mc = runtime.NewMiniCluster(runtime.CheckpointInterval(50*time.Millisecond), runtime.StartFrom(sp))
			go func() {
				_, err := mc.Run(t.Context(), job)
				done <- err
			}()
			if _, err := stopWithSavepoint(t, mc, true, func(checkpoint.Completed) error { return nil }); err != nil {
				t.Fatalf("stop the restored job with drain: %v", err)
			}
			if err := <-done; err != nil {
				t.Fatalf("the restored job after its stop with drain: %v, want it FINISHED", err)
			}
			wantOut = wantOut[:0]
			for _, s := range every {
				b, err := json.Marshal(s)
				if err != nil {
					t.Fatal(err)
				}
				wantOut = append(wantOut, key([]byte(s.User), b))
			}
			got, err = kafkatest.ReadCommitted(context.WithoutCancel(t.Context()), []string{env.Addr}, "sessions")
			if err != nil {
				t.Fatal(err)
			}
			requireExactly(t, "sessions", got, wantOut)
			t.Logf("after the restore and a stop with drain: %d sessions committed", len(got))
		})
	}
}

// stopWithSavepoint stops mc's job with a savepoint, asking again while
// the job is deploying, failing over or restarting.
func stopWithSavepoint(t *testing.T, mc *runtime.MiniCluster, drain bool, write func(checkpoint.Completed) error) (checkpoint.Completed, error) {
	t.Helper()
	for {
		c, err := mc.TriggerSavepoint(t.Context(), true, drain, write)
		if !errors.Is(err, runtime.ErrNotRunning) && !errors.Is(err, checkpoint.ErrDriverStopped) && !errors.Is(err, checkpoint.ErrJobFailover) {
			return c, err
		}
		select {
		case <-t.Context().Done():
			return c, err
		case <-time.After(20 * time.Millisecond): // deploying: ask again
		}
	}
}
