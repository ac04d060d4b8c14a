package sharegroup

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
)

// txnInputs writes inputs k<from>..k<to-1> (values v...) to topic in
// committed transactions of 50, each followed by an aborted transaction of
// 20 records ("ghost" keys) on the same partitions.
func txnInputs(t *testing.T, env *kafkatest.Env, topic string, from, to int) {
	t.Helper()
	for i := from; i < to; i += 50 {
		var recs, ghosts []*kgo.Record
		for k := i; k < min(i+50, to); k++ {
			recs = append(recs, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%03d", k), Value: fmt.Appendf(nil, "v%03d", k)})
		}
		for k := range 20 {
			ghosts = append(ghosts, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%03d", i+k), Value: fmt.Appendf(nil, "ghost%d", i+k)})
		}
		env.WriteTxn(t, "input-committer", true, recs...)
		env.WriteTxn(t, "input-aborter", false, ghosts...)
	}
}

// The plain-Go Session on input written in transactions: committed ones,
// aborted ones between them, and one left open while the session runs,
// then aborted. Exactly the committed records are returned and mirrored,
// each once, read_committed.
func TestSessionReturnsOnlyCommittedInput(t *testing.T) {
	const n = 600
	env := sessEnv(t, 0)
	env.CreateTopic(t, "in", 4, nil)
	env.CreateTopic(t, "out", 4, nil)
	ctx := sessCtx(t, 60*time.Second)
	txnInputs(t, env, "in", 0, n/2)
	var open []*kgo.Record
	for k := range 40 {
		open = append(open, &kgo.Record{Topic: "in", Key: fmt.Appendf(nil, "k%03d", k), Value: fmt.Appendf(nil, "open%d", k)})
	}
	endOpen := env.OpenTxn(t, "input-open", open...)

	l := newSessLedger()
	s := sessOpen(t, env, "iso", "in", "iso-0", BatchSize(40))
	done := make(chan error, 1)
	go func() { done <- sessMirror(ctx, s, "out", n, l) }()
	// The first half is before the open transaction: it comes through.
	for l.count() < n/2 {
		select {
		case err := <-done:
			t.Fatalf("mirror loop ended with %d of %d inputs: %v", l.count(), n, err)
		case <-ctx.Done():
			t.Fatalf("first half not mirrored: %d of %d", l.count(), n/2)
		case <-time.After(20 * time.Millisecond):
		}
	}
	endOpen(false)
	txnInputs(t, env, "in", n/2, n)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	sessCheckOutputs(t, env, "out", n)
}

// ignoreGroupConfigs makes the broker answer every IncrementalAlterConfigs
// with success without applying it: a broker that does not keep the
// group's isolation level.
func ignoreGroupConfigs(env *kafkatest.Env) {
	c := env.Broker.Cluster()
	c.ControlKey(kmsg.IncrementalAlterConfigs.Int16(), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kr.(*kmsg.IncrementalAlterConfigsRequest)
		resp := req.ResponseKind().(*kmsg.IncrementalAlterConfigsResponse)
		for _, r := range req.Resources {
			rr := kmsg.NewIncrementalAlterConfigsResponseResource()
			rr.ResourceType, rr.ResourceName = r.ResourceType, r.ResourceName
			resp.Resources = append(resp.Resources, rr)
		}
		return resp, nil, true
	})
}

// checkIsolationError requires err to say that group reads uncommitted
// records, naming the group and the config.
func checkIsolationError(t *testing.T, err error, group string) {
	t.Helper()
	if !errors.Is(err, ErrReadUncommitted) {
		t.Fatalf("error = %v, want ErrReadUncommitted", err)
	}
	if msg := err.Error(); !strings.Contains(msg, fmt.Sprintf("%q", group)) || !strings.Contains(msg, IsolationLevelConfig) {
		t.Fatalf("error %q does not name the group %q and %s", msg, group, IsolationLevelConfig)
	}
}

// A group that does not read committed records only fails the source and
// the session clearly: at open when the broker does not keep the level
// Weir sets, and while running when the level is changed to
// read_uncommitted. The source's failure is unrecoverable (a restart cannot
// take back what the group handed out meanwhile).
func TestReadUncommittedGroupFailsClearly(t *testing.T) {
	flip := func(t *testing.T, env *kafkatest.Env, group string) {
		t.Helper()
		if err := SetGroupConfig(t.Context(), env.Client(t), group, IsolationLevelConfig, "read_uncommitted"); err != nil {
			t.Fatal(err)
		}
	}
	checkEvery := withCfg(func(c *cfg) { c.checkEvery = 100 * time.Millisecond })
	t.Run("source at open", func(t *testing.T) {
		env := kafkatest.New(t)
		env.CreateTopic(t, "in", 1, nil)
		ignoreGroupConfigs(env)
		_, err := openSourceErr(t, env, 0, nil)
		checkIsolationError(t, err, "g")
		if !errors.Is(err, runtime.ErrUnrecoverable) {
			t.Fatalf("Open error %v is not unrecoverable", err)
		}
	})
	t.Run("source while running", func(t *testing.T) {
		env := kafkatest.New(t)
		env.CreateTopic(t, "in", 1, nil)
		produceN(t, env, "in", 10)
		s := openSource(t, env, 0, nil, checkEvery)
		if got := pollFor(t, s, 10, 20*time.Second); len(got) != 10 {
			t.Fatalf("emitted %d of 10 before the change", len(got))
		}
		flip(t, env, "g")
		var err error
		for deadline := time.Now().Add(20 * time.Second); err == nil && time.Now().Before(deadline); {
			err = s.Poll(t.Context(), &sliceCollector{})
		}
		checkIsolationError(t, err, "g")
		if !errors.Is(err, runtime.ErrUnrecoverable) {
			t.Fatalf("Poll error %v is not unrecoverable", err)
		}
	})
	t.Run("session at open", func(t *testing.T) {
		env := sessEnv(t, 0)
		env.CreateTopic(t, "in", 1, nil)
		ignoreGroupConfigs(env)
		s, err := NewSession(sessCtx(t, 20*time.Second), Brokers(env.Addr), Group("g"), Topics("in"))
		if err == nil {
			s.Close()
		}
		checkIsolationError(t, err, "g")
	})
	t.Run("session while running", func(t *testing.T) {
		env := sessEnv(t, 0)
		sessInputs(t, env, "in", 1, 10)
		s := sessOpen(t, env, "g", "in", "iso-flip", checkEvery)
		ctx := sessCtx(t, 20*time.Second)
		if _, err := s.Poll(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.Abort(ctx); err != nil {
			t.Fatal(err)
		}
		flip(t, env, "g")
		time.Sleep(150 * time.Millisecond) // past checkEvery: the next Poll checks
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := s.Poll(pctx)
		checkIsolationError(t, err, "g")
	})
}

// A re-queue copy whose transaction was aborted (it lost the conflict
// check, or a crash came between its flush and its commit) stays in the
// retry topic as aborted records. The source reads that topic too and must
// never emit such a copy: a committed record written after it is emitted,
// the aborted copy never, and every input once.
func TestAbortedRequeueCopyIsNotEmitted(t *testing.T) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "in", 1, nil)
	env.CreateTopic(t, "g-retry", 1, nil)
	produceN(t, env, "in", 10)
	env.WriteTxn(t, "lost-requeue", false, &kgo.Record{Topic: "g-retry", Value: []byte("3")}, &kgo.Record{Topic: "g-retry", Value: []byte("7")})
	env.WriteTxn(t, "later-requeue", true, &kgo.Record{Topic: "g-retry", Value: []byte("sentinel")})
	s := openSource(t, env, 0, nil)
	c := map[string]int{}
	out := &sliceCollector{}
	for deadline := time.Now().Add(30 * time.Second); c["sentinel"] == 0 || len(c) < 11; {
		if time.Now().After(deadline) {
			t.Fatalf("emitted %v, want each of 0..9 and the sentinel", c)
		}
		out.vals = out.vals[:0]
		if err := s.Poll(t.Context(), out); err != nil {
			t.Fatal(err)
		}
		for _, v := range out.vals {
			c[v]++
		}
	}
	want := map[string]int{"sentinel": 1}
	for i := range 10 {
		want[strconv.Itoa(i)] = 1
	}
	if fmt.Sprint(c) != fmt.Sprint(want) {
		t.Fatalf("emitted %v, want %v: an aborted re-queue copy was emitted", c, want)
	}
}
