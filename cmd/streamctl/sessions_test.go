package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/sessions"
	"github.com/weirstream/weir/internal/kafkatest"
)

// sessionClicks are n clicks of three users from base on, in ts order,
// every user's gaps 20 s, and 45 s every fourth.
func sessionClicks(base int64, n int) []sessions.Click {
	var cs []sessions.Click
	for i := range n {
		user := []string{"ann", "bob", "cat"}[i%3]
		round := int64(i / 3)
		ts := base + round*20_000 + round/4*25_000 + int64(i%3)*1_000
		cs = append(cs, sessions.Click{User: user, TS: ts})
	}
	return cs
}

func clickRecords(cs []sessions.Click) []*kgo.Record {
	recs := make([]*kgo.Record, len(cs))
	for i, c := range cs {
		recs[i] = &kgo.Record{Topic: "clicks", Key: []byte(c.User), Value: fmt.Appendf(nil, `{"user":%q,"ts":%d,"url":"/"}`, c.User, c.TS)}
	}
	return recs
}

// The sessions job as a `streamctl run` process, SIGKILLed once its first
// sessions are committed, with a session still open in its window state
// (the clock user's), then started again on its checkpoint dir: the second
// process restores the open session, extends it with a click of the second
// input, and read_committed "sessions" holds exactly the sessions of the
// whole input, each once, nothing on the late topic.
func TestSessionsJobContinuesExactlyOnceAfterSIGKILL(t *testing.T) {
	env := kafkatest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	env.CreateTopic(t, "clicks", 1, nil)
	produce := func(recs []*kgo.Record) {
		t.Helper()
		if err := env.Client(t).ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	const base = int64(1_700_000_000_000)
	first := sessionClicks(base, 90)
	clock1 := sessions.Click{User: "clock", TS: first[len(first)-1].TS + 10*30_000}
	first = append(first, clock1)
	produce(clickRecords(first))
	job := startRunJob(t, "sessions", t.TempDir(), "brokers="+env.Addr)
	want1 := sessions.Expected(first, 30*time.Second, 5*time.Second)
	atLeast(t, ctx, env.Addr, "sessions", len(want1), job)
	job.kill()

	second := append([]sessions.Click{{User: "clock", TS: clock1.TS + 1_000}}, sessionClicks(clock1.TS+1_000, 60)...)
	clock2 := sessions.Click{User: "clock", TS: second[len(second)-1].TS + 10*30_000}
	second = append(second, clock2)
	produce(clickRecords(second))
	all := append(append([]sessions.Click{}, first...), second...)
	want := sessions.Expected(all, 30*time.Second, 5*time.Second)
	atLeast(t, ctx, env.Addr, "sessions", len(want), job)
	job.stop()
	got := env.ReadCommitted(t, "sessions")

	count := map[string]int{}
	for _, s := range want {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		count[s.User+" "+string(b)]++
	}
	restored := false
	for _, r := range got {
		count[string(r.Key)+" "+string(r.Value)]--
	}
	for _, s := range want {
		restored = restored || s.User == "clock" && s.Start == clock1.TS && s.Clicks == 2
	}
	for k, n := range count {
		if n != 0 {
			t.Errorf("sessions: %q %d times too few (negative: too many)", k, n)
		}
	}
	if len(got) != len(want) || !restored {
		t.Errorf("sessions: %d records, want %d (clock session of both processes expected: %v)", len(got), len(want), restored)
	}
	if late, err := kafkatest.ReadCommitted(ctx, []string{env.Addr}, "late-clicks"); err == nil && len(late) != 0 {
		t.Errorf("late-clicks: %d records, want none", len(late))
	}
	t.Logf("%d clicks, %d sessions, each once across the SIGKILL", len(all), len(want))
}
