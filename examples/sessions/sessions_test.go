package sessions_test

import (
	"context"
	"encoding/json"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/weirstream/weir/examples/sessions"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/weirtest"
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
// (29.999 s, exactly 30 s: the same session, 31 s: a new one), in production order: out of order, but
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
	// The job must merge a click exactly gap after its user's previous one
	// into that session (as Flink: windows that touch merge); the data
	// must hold such clicks for the comparison with Expected to check it.
	last, touching := map[string]int64{}, 0
	byTS := slices.Clone(cs)
	sort.SliceStable(byTS, func(i, j int) bool { return byTS[i].ts < byTS[j].ts })
	for _, c := range byTS {
		if prev, ok := last[c.user]; ok && c.ts-prev == gap {
			touching++
		}
		last[c.user] = c.ts
	}
	if touching == 0 {
		t.Fatal("test data: no click exactly gap after its user's previous click")
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

// waitFor waits until topic holds at least n records read_committed. It
// fails when no new record came for 2 minutes (the job stalled; a loaded
// machine only makes it slower: a fixed 2-minute deadline failed the
// source=kafka case at volume at a load average of 15), or after 10 minutes.
func waitFor(t *testing.T, env *kafkatest.Env, done <-chan error, topic string, n int) {
	t.Helper()
	const stall = 2 * time.Minute
	deadline := time.Now().Add(10 * time.Minute)
	last, since := -1, time.Now()
	for {
		recs, err := kafkatest.ReadCommitted(t.Context(), []string{env.Addr}, topic)
		if err == nil && len(recs) >= n {
			return
		}
		if err == nil && len(recs) != last {
			last, since = len(recs), time.Now()
		}
		if now := time.Now(); now.Sub(since) > stall || now.After(deadline) {
			t.Fatalf("%s did not reach %d records: %d read_committed, the last new one %v ago (%v)", topic, n, len(recs), now.Sub(since).Round(time.Second), err)
		}
		select {
		case err := <-done:
			t.Fatalf("job ended early: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// key is a record's key and value, for comparing topics as multisets.
func key(k, v []byte) string { return string(k) + "\x00" + string(v) }

// requireExactly fails unless got holds each of want exactly once and
// nothing else (weirtest.CheckEachOnce on key and value).
func requireExactly(t *testing.T, topic string, got []*kgo.Record, want []string) {
	t.Helper()
	keys := make([]string, len(got))
	for i, r := range got {
		keys[i] = key(r.Key, r.Value)
	}
	if err := weirtest.CheckEachOnce(keys, want); err != nil {
		t.Errorf("%s: %v", topic, err)
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

// Expected, the reference the job's output is compared with, merges as
// Flink merges session windows (TimeWindow.intersects is inclusive): a
// click exactly gap after the previous one joins its session, one more
// than gap after starts a new one.
func TestExpectedJoinsAClickExactlyTheGapAfterThePreviousOne(t *testing.T) {
	const g = 10
	clicks := []sessions.Click{{User: "ann", TS: 0}, {User: "ann", TS: 10}, {User: "ann", TS: 31}, {User: "ann", TS: 100}}
	got := sessions.Expected(clicks, g*time.Millisecond, 0)
	want := []sessions.Session{{User: "ann", Start: 0, End: 20, Clicks: 2}, {User: "ann", Start: 31, End: 41, Clicks: 1}}
	if !slices.Equal(got, want) {
		t.Fatalf("sessions %v, want %v", got, want)
	}
}
