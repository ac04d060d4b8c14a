package sessions_test

import (
	"context"
	"encoding/json"
	"sort"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/weirstream/weir/examples/sessions"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	gap = 30_000 // ms, the job's default gap
	ooo = 5_000  // ms, the job's default out-of-orderness
	t0  = int64(1_700_000_000_000)
)

type click struct {
	user string
	ts   int64
}

func (c click) record(topic string) *kgo.Record {
	return sessions.Click{User: c.user, TS: c.ts}.Record(topic)
}

// onTimeClicks are clicks of four users whose gaps straddle the session gap
// (29.999 s, exactly 30 s, more), in production order: out of order, but
// never by as much as the out-of-orderness bound.
func onTimeClicks(t *testing.T) []click {
	t.Helper()
	deltas := []int64{1_000, 7_000, 12_000, 45_000, 3_000, 31_000, 29_999, 30_000, 2_000, 60_000, 500}
	var cs []click
	for u, user := range []string{"ann", "bob", "cat", "dan"} {
		ts := t0 + int64(u)*1_700
		for i := range 40 {
			cs = append(cs, click{user, ts})
			ts += deltas[(i+u)%len(deltas)]
		}
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].ts < cs[j].ts })
	// Swap every third close pair: out of order by less than the bound.
	for i := 0; i+1 < len(cs); i += 3 {
		if cs[i+1].ts-cs[i].ts < ooo-1_000 {
			cs[i], cs[i+1] = cs[i+1], cs[i]
		}
	}
	maxTS, swapped := int64(0), 0
	for _, c := range cs {
		if c.ts < maxTS {
			swapped++
		}
		if c.ts < maxTS-ooo+1_000 {
			t.Fatalf("test data: click %v is out of order beyond the bound", c)
		}
		maxTS = max(maxTS, c.ts)
	}
	if swapped < 10 {
		t.Fatalf("test data: only %d clicks out of order", swapped)
	}
	return cs
}

// expectedSessions is the contract's sessions of cs (sessions.Expected).
func expectedSessions(cs []click) []sessions.Session {
	clicks := make([]sessions.Click, len(cs))
	for i, c := range cs {
		clicks[i] = sessions.Click{User: c.user, TS: c.ts}
	}
	return sessions.Expected(clicks, gap*time.Millisecond, ooo*time.Millisecond)
}

func produce(t *testing.T, env *kafkatest.Env, recs ...*kgo.Record) {
	t.Helper()
	if err := env.Client(t).ProduceSync(t.Context(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// waitFor waits until topic holds at least n records read_committed.
func waitFor(t *testing.T, env *kafkatest.Env, done <-chan error, topic string, n int) {
	t.Helper()
	deadline := time.After(2 * time.Minute)
	for {
		recs, err := kafkatest.ReadCommitted(t.Context(), []string{env.Addr}, topic)
		if err == nil && len(recs) >= n {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("job ended early: %v", err)
		case <-deadline:
			t.Fatalf("%s did not reach %d records: %d read_committed (%v)", topic, n, len(recs), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// key is a record's key and value, for comparing topics as multisets.
func key(k, v []byte) string { return string(k) + "\x00" + string(v) }

// requireExactly fails unless got holds each of want exactly once and
// nothing else.
func requireExactly(t *testing.T, topic string, got []*kgo.Record, want []string) {
	t.Helper()
	count := map[string]int{}
	for _, w := range want {
		count[w]++
	}
	for _, r := range got {
		count[key(r.Key, r.Value)]--
	}
	for k, n := range count {
		switch {
		case n > 0:
			t.Errorf("%s: missing %q", topic, k)
		case n < 0:
			t.Errorf("%s: %q %d extra times", topic, k, -n)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%s: %d records, want %d", topic, len(got), len(want))
	}
}

func TestSessionsEmitsEverySessionOnceAndLateClicksToTheLateTopic(t *testing.T) {
	for _, parallelism := range []string{"1", "2"} {
		t.Run("parallelism="+parallelism, func(t *testing.T) {
			env := kafkatest.New(t)
			env.CreateTopic(t, "clicks", 1, nil) // one partition: production order is the bound's order
			reg := runtime.NewRegistry()
			if err := sessions.Register(reg); err != nil {
				t.Fatal(err)
			}
			job, err := reg.Build(sessions.Name, map[string]string{"brokers": env.Addr, "parallelism": parallelism})
			if err != nil {
				t.Fatal(err)
			}

			// Phase 1: on-time clicks, a few malformed values among them, and a
			// click of "clock" far enough ahead that every other session fires.
			onTime := onTimeClicks(t)
			malformed := []string{`not json`, `{"user":"ann"}`, `{"user":"","ts":1}`, `{"user":"bob","ts":1.5}`, `["ann",1]`}
			var recs []*kgo.Record
			for i, c := range onTime {
				recs = append(recs, c.record("clicks"))
				if i%37 == 5 && len(malformed) > i/37 {
					recs = append(recs, &kgo.Record{Topic: "clicks", Key: []byte("bad"), Value: []byte(malformed[i/37])})
				}
			}
			clock := click{"clock", onTime[len(onTime)-1].ts + 10*gap}
			for _, c := range onTime {
				clock.ts = max(clock.ts, c.ts+10*gap)
			}
			onTime = append(onTime, clock)
			recs = append(recs, clock.record("clicks"))
			produce(t, env, recs...)
			want := expectedSessions(onTime)
			var wantOut []string
			for _, s := range want {
				b, err := json.Marshal(s)
				if err != nil {
					t.Fatal(err)
				}
				wantOut = append(wantOut, key([]byte(s.User), b))
			}

			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() {
				_, err := runtime.NewMiniCluster(runtime.CheckpointInterval(50*time.Millisecond)).Run(ctx, job)
				done <- err
			}()
			stopped := false
			stop := func() {
				if !stopped {
					stopped = true
					cancel()
					<-done
				}
			}
			defer stop()
			waitFor(t, env, done, "sessions", len(want))

			// Phase 2: clicks whose sessions have fired (inside fired sessions,
			// and a new user at the first clicks' time): late, to the late topic.
			late := []click{{"ann", t0 + 500}, {"bob", onTime[20].ts}, {"cat", t0 + 12_345}, {"eve", t0}, {"dan", clock.ts - ooo - gap - 1}}
			recs = recs[:0]
			var wantLate []string
			for _, c := range late {
				r := c.record("clicks")
				recs = append(recs, r)
				wantLate = append(wantLate, key(r.Key, r.Value))
			}
			produce(t, env, recs...)
			waitFor(t, env, done, "late-clicks", len(late))
			waitFor(t, env, done, "sessions-dlq", len(malformed))
			stop()

			requireExactly(t, "sessions", env.ReadCommitted(t, "sessions"), wantOut)
			requireExactly(t, "late-clicks", env.ReadCommitted(t, "late-clicks"), wantLate)
			var wantDLQ []string
			for _, m := range malformed {
				wantDLQ = append(wantDLQ, key([]byte("bad"), []byte(m)))
			}
			requireExactly(t, "sessions-dlq", env.ReadCommitted(t, "sessions-dlq"), wantDLQ)
			t.Logf("%d clicks on time, %d sessions, %d late clicks, %d dead letters: each exactly once",
				len(onTime), len(want), len(late), len(malformed))
		})
	}
}
