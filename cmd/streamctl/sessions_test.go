package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/sessions"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/internal/proctest"
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
// whole input, each once, nothing on the late topic. On each state backend
// (the session windows' map state and timers on the heap, or in pebble).
func TestSessionsJobContinuesExactlyOnceAfterSIGKILL(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"heap", "pebble"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			testSessionsAfterSIGKILL(t, backend)
		})
	}
}

func testSessionsAfterSIGKILL(t *testing.T, backend string) {
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
	job := startRunJob(t, "sessions", t.TempDir(), "brokers="+env.Addr, "state-backend="+backend)
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

// clickFeed writes clicks to the "clicks" topic while a test runs, each
// batch in its own committed transaction followed by an aborted one of
// clicks of "ghost" users that must never count. Event time follows the
// wall clock, each click up to 2 s behind it: out of order by less than
// the job's 5 s bound. Every user clicks in bursts: 6 s of clicks, then 9 s
// of silence, longer than the 5 s gap the test gives the job, so sessions
// keep ending. Writes that fail (the broker is down) are retried by the
// next batch; the expected sessions come from the input as committed.
type clickFeed struct {
	kafkatest.Feeder
	addr  func() string
	start time.Time
	n     int
}

func (f *clickFeed) write(ctx context.Context, clicks int) error {
	now := time.Now()
	var recs, ghosts []*kgo.Record
	el := int(now.Sub(f.start) / time.Second)
	for range clicks {
		i := f.n
		f.n++
		user := fmt.Sprintf("u%d", i%8)
		if (el+3*(i%8))%15 >= 6 {
			user = "steady" // u<i%8> is silent now
		}
		ts := now.UnixMilli() - int64(i*37%2000)
		recs = append(recs, &kgo.Record{Topic: "clicks", Key: []byte(user),
			Value: fmt.Appendf(nil, `{"user":%q,"ts":%d,"url":"/c/%d"}`, user, ts, i)})
		ghosts = append(ghosts, &kgo.Record{Topic: "clicks", Key: []byte("ghost"),
			Value: fmt.Appendf(nil, `{"user":"ghost%d","ts":%d,"url":"/g"}`, i%3, ts)})
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := kafkatest.WriteTxn(wctx, []string{f.addr()}, "clicks-committer", true, recs...); err != nil {
		return nil // the broker is down: the next batch tries again
	}
	_ = kafkatest.WriteTxn(wctx, []string{f.addr()}, "clicks-aborter", false, ghosts...)
	return nil
}

// inputClicks reads the committed clicks of "clicks".
func inputClicks(t *testing.T, ctx context.Context, addr string) []sessions.Click {
	t.Helper()
	recs, err := kafkatest.ReadCommitted(ctx, []string{addr}, "clicks")
	if err != nil {
		t.Fatal(err)
	}
	cs := make([]sessions.Click, 0, len(recs))
	for _, r := range recs {
		c, err := sessions.ParseClick(r)
		if err != nil {
			t.Fatalf("input: %v", err)
		}
		cs = append(cs, c)
	}
	return cs
}

// requireRecords fails unless got holds each of want (key, value) exactly
// once and nothing else.
func requireRecords(t *testing.T, topic string, got []*kgo.Record, want [][2]string) {
	t.Helper()
	count := map[[2]string]int{}
	for _, w := range want {
		count[w]++
	}
	for _, r := range got {
		count[[2]string{string(r.Key), string(r.Value)}]--
	}
	for k, n := range count {
		switch {
		case n > 0:
			t.Errorf("%s: missing %s %s", topic, k[0], k[1])
		case n < 0:
			t.Errorf("%s: %s %s %d extra times", topic, k[0], k[1], -n)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%s: %d records, want %d", topic, len(got), len(want))
	}
}

// The sessions job submitted to a job manager with two task managers, each
// a process, against `streamctl broker --data-dir` as a process, with the
// job's default settings but a 5 s gap: four input partitions (two lanes
// per source subtask), Kafka's default record-lock duration (30 s), input
// written throughout in transactions, half of them aborted. One process
// fails while clicks are in flight: a task manager SIGKILLed (the job
// restarts on the other; the broker releases the clicks the dead one held
// when its connections close), a task manager stopped (SIGSTOP; the job
// restarts on the other, and the clicks the hung one held come back only
// when the broker fences its consumers, behind newer ones), or the broker
// SIGKILLed (restarted on the same data dir and address). The
// input is never out of order by as much as the bound, so read_committed
// "sessions" must hold exactly the sessions of the committed input computed
// by definition, each once, no aborted click counted; and "late-clicks"
// exactly the clicks written late on purpose at the end, each once. On
// the pebble state backend (the session windows' map state and timers in
// pebble under the task managers' data dirs), the task manager SIGKILL is
// followed by a rescale 2 -> 3 -> 2 through savepoints, with the same
// checks over the four jobs' output.
func TestSessionsJobSurvivesSIGKILLsWithNoLateClickAndEverySessionOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []sessionsFailure{
		{kill: "task manager", backend: "heap"},
		{kill: "hung task manager", backend: "heap"},
		{kill: "broker", backend: "heap"},
		{kill: "task manager", backend: "pebble", rescale: true},
	} {
		name := strings.ReplaceAll(tc.kill, " ", "-")
		if tc.backend != "heap" {
			name += "-on-" + tc.backend
		}
		if tc.rescale {
			name += "-and-a-rescale"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel() // each case waits 45 s or more past its failure
			sessionsThroughASIGKILL(t, tc)
		})
	}
}

// sessionsFailure is a case of sessionsThroughASIGKILL: the process killed,
// the state backend, and whether a rescale 2 -> 3 -> 2 follows.
type sessionsFailure struct {
	kill, backend string
	rescale       bool
}

func sessionsThroughASIGKILL(t *testing.T, tc sessionsFailure) {
	kill := tc.kill
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	b, _ := clicksBroker(t, ctx, 4)
	addr := func() string { b.mu.Lock(); defer b.mu.Unlock(); return b.addr }
	c := proctest.NewCluster(t, streamctlBin)
	startTM := func(id string) {
		if tc.backend == "heap" {
			c.StartTM(id, 2)
			return
		}
		c.StartTMWith(id, 2, nil, "--data-dir", filepath.Join(c.DataDir, id), "--state-memory", "64MiB")
	}
	startTM("tm-a")
	startTM("tm-b")
	c.WaitTMs("tm-a,tm-b")
	defer func() {
		if t.Failed() {
			t.Logf("%s\nbroker stderr:\n%s", c.Logs(80), b.stderr())
		}
	}()

	feed := &clickFeed{Feeder: kafkatest.Feeder{Lines: 4, Every: 100 * time.Millisecond}, addr: addr, start: time.Now()}
	feed.Run(ctx, feed.write)
	args := []string{"sessions", "--checkpoint-interval", "200ms", "--state-backend", tc.backend,
		"--set", "brokers=" + b.addr, "--set", "gap=5s"}
	id := c.Submit(append(args, "--parallelism", "2")...)
	sessionsAtLeast := func(n int, what string) int {
		t.Helper()
		for {
			actx, acancel := context.WithTimeout(ctx, 20*time.Second)
			recs, err := kafkatest.ReadCommitted(actx, []string{addr()}, "sessions")
			acancel()
			if err == nil && len(recs) >= n {
				return len(recs)
			}
			if ctx.Err() != nil {
				t.Fatalf("sessions: %d read_committed (%v), want %d %s", len(recs), err, n, what)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	before := sessionsAtLeast(5, "before the kill")
	if tc.backend == "pebble" {
		// The session windows' pebble instances live under the task
		// managers' --data-dir/state.
		if insts, err := filepath.Glob(filepath.Join(c.DataDir, "tm-*", "state", "*")); err != nil || len(insts) == 0 {
			t.Fatalf("pebble instances under the task managers' data dirs: %v (%v), want some", insts, err)
		}
	}
	switch kill {
	case "task manager":
		c.TMs["tm-a"].Kill(t)
		c.WaitStatus(id, "restart on the task manager left", func(s proctest.JobStatus) bool { return s.Restarts >= 1 && s.State == "RUNNING" })
	case "hung task manager":
		// Its consumers keep their clicks, unrenewed, until the broker
		// fences them (share session timeout), after the job restarted
		// on tm-b: the clicks come back behind newer ones.
		p := c.TMs["tm-a"]
		if err := p.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		c.WaitStatus(id, "restart on the task manager left", func(s proctest.JobStatus) bool { return s.Restarts >= 1 && s.State == "RUNNING" })
		time.Sleep(20 * time.Second)
		p.Kill(t)
	case "broker":
		b.crash(time.Second)
	}
	killed := time.Now()
	// Input goes on past the hold (lock duration 30 s) and the records'
	// return; sessions keep coming.
	sessionsAtLeast(before+5, "after the kill")
	time.Sleep(time.Until(killed.Add(45 * time.Second)))
	restarts := c.Status(id).Restarts
	if tc.rescale {
		// 2 -> 3 -> 2 through savepoints while clicks keep coming; the
		// share group keeps what no job is reading meanwhile.
		startTM("tm-c")
		c.WaitTMs("tm-b,tm-c")
		pc := &procCluster{Cluster: c, t: t}
		spDir := filepath.Join(c.DataDir, "savepoints")
		for _, par := range []string{"3", "2"} {
			sp := pc.stopWithSavepoint(id, spDir)
			id = c.Submit(append(args, "--parallelism", par, "--from-savepoint", sp)...)
			sessionsAtLeast(sessionsAtLeast(0, "")+5, "at parallelism "+par)
		}
		if st := c.Status(id); st.State != "RUNNING" || st.StateBackend != tc.backend {
			t.Fatalf("job %s: %+v, want RUNNING on %s", id, st, tc.backend)
		}
	}
	feed.Halt(t)

	// A click far ahead ends every session; then the expected sessions come
	// from the committed input.
	clock := fmt.Appendf(nil, `{"user":"clock","ts":%d,"url":"/"}`, time.Now().Add(10*time.Minute).UnixMilli())
	if err := kafkatest.WriteTxn(ctx, []string{addr()}, "clicks-committer", true,
		&kgo.Record{Topic: "clicks", Key: []byte("clock"), Value: clock}); err != nil {
		t.Fatal(err)
	}
	in := inputClicks(t, ctx, addr())
	want := sessions.Expected(in, 5*time.Second, 5*time.Second)
	var wantOut [][2]string
	for _, s := range want {
		v, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		wantOut = append(wantOut, [2]string{s.User, string(v)})
	}
	sessionsAtLeast(len(wantOut), "in all")

	// Clicks truly late: their sessions fired long ago.
	var late []*kgo.Record
	var wantLate [][2]string
	for i, u := range []string{"u0", "u3", "steady", "newcomer"} {
		r := &kgo.Record{Topic: "clicks", Key: []byte(u),
			Value: fmt.Appendf(nil, `{"user":%q,"ts":%d,"url":"/late"}`, u, feed.start.UnixMilli()+int64(i)*1000)}
		late = append(late, r)
		wantLate = append(wantLate, [2]string{u, string(r.Value)})
	}
	if err := kafkatest.WriteTxn(ctx, []string{addr()}, "clicks-committer", true, late...); err != nil {
		t.Fatal(err)
	}
	for {
		recs, err := kafkatest.ReadCommitted(ctx, []string{addr()}, "late-clicks")
		if err == nil && len(recs) >= len(late) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("late-clicks: %d read_committed (%v), want %d", len(recs), err, len(late))
		}
		time.Sleep(250 * time.Millisecond)
	}
	if _, err := c.Run("cancel", id); err != nil {
		t.Logf("cancel: %v", err) // the checks below read what is committed
	}
	requireRecords(t, "sessions", committed(t, ctx, addr(), "sessions"), wantOut)
	requireRecords(t, "late-clicks", committed(t, ctx, addr(), "late-clicks"), wantLate)
	t.Logf("%s SIGKILL on %s (rescale 2 -> 3 -> 2: %v): %d clicks committed, %d sessions (%d before the kill) each once, %d late clicks, restarts %d",
		kill, tc.backend, tc.rescale, len(in), len(want), before, len(late), restarts)
}

// At volume and through a task-manager SIGKILL (issue 36): 50,000 clicks of
// 700 users, in event-time order within 2 s on each of 8 partitions, wait
// as a backlog; the sessions job (parallelism 2, two task manager
// processes, the defaults: lanes, fetch sizes, the 30 s record lock) reads
// them through a share group, and one task manager is SIGKILLed once
// sessions are committed. Its held clicks come back only when the broker
// releases them, behind newer ones; the watermark follows the group's
// frontier, so none is late, and every session the input holds is emitted
// once, read_committed.
func TestSessionsAtVolumeThroughATaskManagerSIGKILLHaveNoLateClick(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	b, adm := clicksBroker(t, ctx, 8)
	clicks := sessions.Generate(700, time.Now().Add(-time.Hour).UnixMilli(), 20*time.Minute, 2*time.Second, 36)
	recs := make([]*kgo.Record, len(clicks))
	for i, c := range clicks {
		recs[i] = c.Record("clicks")
	}
	if err := adm.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	want := sessions.Expected(clicks, 30*time.Second, 5*time.Second)
	wantOut := make([][2]string, len(want))
	for i, s := range want {
		v, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		wantOut[i] = [2]string{s.User, string(v)}
	}
	c := proctest.NewCluster(t, streamctlBin)
	c.StartTM("tm-a", 2)
	c.StartTM("tm-b", 2)
	c.WaitTMs("tm-a,tm-b")
	defer func() {
		if t.Failed() {
			t.Logf("%s\nbroker stderr:\n%s", c.Logs(80), b.stderr())
		}
	}()
	id := c.Submit("sessions", "--parallelism", "2", "--checkpoint-interval", "200ms",
		"--set", "brokers="+b.addr, "--set", "idle=2s")
	before := len(atLeast(t, ctx, b.addr, "sessions", 1))
	c.TMs["tm-a"].Kill(t)
	c.WaitStatus(id, "restart on the task manager left", func(s proctest.JobStatus) bool { return s.Restarts >= 1 && s.State == "RUNNING" })
	atLeast(t, ctx, b.addr, "sessions", len(wantOut))
	if _, err := c.Run("cancel", id); err != nil {
		t.Logf("cancel: %v", err) // the checks below read what is committed
	}
	requireRecords(t, "sessions", committed(t, ctx, b.addr, "sessions"), wantOut)
	requireRecords(t, "late-clicks", committed(t, ctx, b.addr, "late-clicks"), nil)
	t.Logf("%d clicks, %d sessions (%d committed before the SIGKILL) each once, none late", len(clicks), len(want), before)
}

// clicksBroker starts `streamctl broker` on a data dir of its own, with
// the topic "clicks" of partitions partitions, and returns it with a
// client of it (closed when the test ends).
func clicksBroker(t *testing.T, ctx context.Context, partitions int32) (*crashingBroker, *kgo.Client) {
	t.Helper()
	b := &crashingBroker{t: t, dir: t.TempDir()}
	b.start()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, partitions, 1, nil, "clicks"); err != nil {
		t.Fatal(err)
	}
	return b, cl
}
