package sessions_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/sessions"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/weirtest"
)

// The sessions job tested with the public kit (weirtest), as a user tests
// a job: a session closes when a later click moves the watermark past its
// end, a click of an aborted input transaction never counts, and a click
// that comes after its session fired goes to the late topic unchanged,
// each exactly once.
func TestASessionClosesOnTheWatermarkAndALateClickGoesToTheLateOutput(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	k, err := weirtest.StartKafka(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if err := k.CreateTopic(ctx, "clicks", 1, nil); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, "clicks", click{"ann", t0}.record(""), click{"ann", t0 + 10_000}.record("")); err != nil {
		t.Fatal(err)
	}
	if err := k.ProduceTxn(ctx, "aborted-clicks", false, "clicks", click{"ann", t0 + 20_000}.record("")); err != nil {
		t.Fatal(err)
	}
	// bob's click moves the watermark to t0+95s, past ann's session end
	// (t0+40s): it fires.
	if err := k.Produce(ctx, "clicks", click{"bob", t0 + 100_000}.record("")); err != nil {
		t.Fatal(err)
	}
	job, err := sessions.Build(runtime.Params{"brokers": k.Addr(), "input": "clicks", "output": "sessions", "late": "late-clicks",
		"group": "sessions", "gap": "30s", "out-of-orderness": "5s", "idle": "10s", "max-drift": "1m"})
	if err != nil {
		t.Fatal(err)
	}
	run, err := weirtest.StartJob(job)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := run.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	}()
	session, err := sessions.SessionRecord("sessions", sessions.Session{User: "ann", Start: t0, End: t0 + 10_000 + gap, Clicks: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run.WaitCommitted(ctx, k, "sessions", func(recs []*kgo.Record) bool { return len(recs) >= 1 }); err != nil {
		t.Fatal(err)
	}

	late := click{"ann", t0 + 5_000}.record("")
	if err := k.Produce(ctx, "clicks", late); err != nil {
		t.Fatal(err)
	}
	if _, err := run.WaitCommitted(ctx, k, "late-clicks", func(recs []*kgo.Record) bool { return len(recs) >= 1 }); err != nil {
		t.Fatal(err)
	}
	if err := run.WaitCheckpoints(ctx, 2); err != nil { // nothing more may come
		t.Fatal(err)
	}
	for topic, want := range map[string]*kgo.Record{"sessions": session, "late-clicks": late} {
		recs, err := k.ReadCommitted(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]string, len(recs))
		for i, r := range recs {
			got[i] = key(r.Key, r.Value)
		}
		if err := weirtest.CheckEachOnce(got, []string{key(want.Key, want.Value)}); err != nil {
			t.Errorf("%s: %v", topic, err)
		}
	}
}
