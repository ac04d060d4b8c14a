package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
	weirruntime "github.com/weirstream/weir/runtime"
)

// rule is a record of the broadcast test job: a rule (name, limit) on the
// broadcast side, a click of user Name on the data side.
type rule struct {
	Name  string
	Limit int64
}

// limiter keeps the rules in the broadcast states "limits" (name -> limit)
// and "names" (limit -> name), and counts each user's clicks in keyed
// state "clicks".
type limiter struct {
	limits *weirruntime.BroadcastState[string, int64]
	names  *weirruntime.BroadcastState[int64, string]
	clicks *weirruntime.ValueState[int64]
}

func (l *limiter) Open(_ context.Context, st *weirruntime.StateRegistry[string], bs *weirruntime.BroadcastRegistry) error {
	var err error
	if l.limits, err = weirruntime.NewBroadcastState[string, int64](bs, "limits", nil, nil); err != nil {
		return err
	}
	if l.names, err = weirruntime.NewBroadcastState[int64, string](bs, "names", nil, nil); err != nil {
		return err
	}
	l.clicks, err = weirruntime.NewValueState[int64](st, "clicks", nil)
	return err
}

func (l *limiter) ProcessElement(_ *weirruntime.KeyedContext[string], v rule, _ weirruntime.Collector[int64]) error {
	n, _ := l.clicks.Value()
	l.clicks.Update(n + 1)
	return nil
}

func (l *limiter) ProcessBroadcastElement(_ *weirruntime.BroadcastContext, r rule, _ weirruntime.Collector[int64]) error {
	if err := l.limits.Put(r.Name, r.Limit); err != nil {
		return err
	}
	return l.names.Put(r.Limit, r.Name)
}

func (l *limiter) OnTimer(*weirruntime.KeyedContext[string], int64, weirruntime.Collector[int64]) error {
	return nil
}

// tagger is a non-keyed broadcast operator with the broadcast state "tags".
type tagger struct {
	tags *weirruntime.BroadcastState[string, int64]
}

func (g *tagger) Open(_ context.Context, bs *weirruntime.BroadcastRegistry) error {
	var err error
	g.tags, err = weirruntime.NewBroadcastState[string, int64](bs, "tags", nil, nil)
	return err
}

func (g *tagger) ProcessElement(*weirruntime.BroadcastContext, rule, weirruntime.Collector[int64]) error {
	return nil
}

func (g *tagger) ProcessBroadcastElement(_ *weirruntime.BroadcastContext, r rule, _ weirruntime.Collector[int64]) error {
	return g.tags.Put("tag-"+r.Name, r.Limit*10)
}

// broadcastJob sends rules, broadcast, to the keyed operator "limits" and
// the non-keyed operator "tags", both at parallelism 2, with clicks as
// their data streams.
func broadcastJob(rules, clicks []rule, emitted *atomic.Int32) *weirruntime.Job {
	j := weirruntime.NewJob("test-broadcast", weirruntime.DefaultParallelism(2), weirruntime.MaxParallelism(16))
	held := func(recs []rule) func() weirruntime.Source[rule] {
		return func() weirruntime.Source[rule] {
			return &heldSource[rule]{recs: recs, emitted: func() { emitted.Add(1) }}
		}
	}
	rs := weirruntime.FromSource(j, "rules", held(rules), weirruntime.Parallelism(1))
	cs := weirruntime.FromSource(j, "clicks", held(clicks), weirruntime.Parallelism(1))
	discard := weirruntime.SinkFunc(func(context.Context, int64) error { return nil })
	byUser := weirruntime.KeyBy(cs, func(c rule) string { return c.Name }, nil)
	weirruntime.SinkTo(weirruntime.ProcessKeyedBroadcast(byUser, rs, "limits",
		func() weirruntime.KeyedBroadcastProcessor[string, rule, rule, int64] { return &limiter{} }), "discard-limits", discard)
	weirruntime.SinkTo(weirruntime.ProcessBroadcast(cs, rs, "tags",
		func() weirruntime.BroadcastProcessor[rule, rule, int64] { return &tagger{} }), "discard-tags", discard)
	return j
}

// A savepoint of a job with broadcast state, a keyed broadcast operator and
// a non-keyed one at parallelism 2: state dump prints each operator's
// broadcast states by name, every entry once, decoded through the codecs
// the operator declares (and the keyed operator's keyed state after them);
// inspect reports each broadcast state's entries and bytes; without the
// job's type the broadcast state is not guessed at.
func TestDumpAndInspectShowBroadcastStateByNameAsTheOperatorDeclaresIt(t *testing.T) {
	rules := []rule{{"gold", 100}, {"silver", 50}, {"bronze", 10}, {"gold", 120}}
	clicks := []rule{{Name: "ann"}, {Name: "bob"}, {Name: "ann"}}
	var emitted atomic.Int32
	c := checkpointOfHeldJob(t, "test-broadcast", broadcastJob(rules, clicks, &emitted), func() bool { return emitted.Load() == 2 })
	sp := filepath.Join(t.TempDir(), "sp")
	if err := checkpoint.WriteSavepoint(t.Context(), sp, c, time.Now(), checkpoint.WithJob("test-broadcast", nil)); err != nil {
		t.Fatal(err)
	}
	bare := filepath.Join(t.TempDir(), "bare")
	if err := checkpoint.WriteSavepoint(t.Context(), bare, c, time.Now()); err != nil {
		t.Fatal(err)
	}

	reg := weirruntime.NewRegistry()
	if err := reg.Register(weirruntime.JobType{Name: "test-broadcast", Build: func(weirruntime.Params) (*weirruntime.Job, error) {
		return broadcastJob(nil, nil, new(atomic.Int32)), nil
	}}); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		root := newRootCmd(reg, &out, &errOut)
		root.SetArgs(args)
		if err := root.ExecuteContext(t.Context()); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, errOut.String())
		}
		return out.String(), errOut.String()
	}
	lines := func(out string) []string { return strings.Split(strings.TrimSpace(out), "\n") }

	for _, tc := range []struct {
		uid  string
		want []string
	}{
		{"limits", []string{
			`{"broadcast_state":"limits","key":"bronze","value":10}`,
			`{"broadcast_state":"limits","key":"gold","value":120}`,
			`{"broadcast_state":"limits","key":"silver","value":50}`,
		}},
		{"tags", []string{
			`{"broadcast_state":"tags","key":"tag-bronze","value":100}`,
			`{"broadcast_state":"tags","key":"tag-gold","value":1200}`,
			`{"broadcast_state":"tags","key":"tag-silver","value":500}`,
		}},
	} {
		out, _ := run("state", "dump", sp, "--operator", tc.uid)
		got := lines(out)
		if len(got) < len(tc.want) || strings.Join(got[:len(tc.want)], "\n") != strings.Join(tc.want, "\n") {
			t.Fatalf("dump of %s:\n%s\nwant it to start with\n%s", tc.uid, out, strings.Join(tc.want, "\n"))
		}
		rest := got[len(tc.want):]
		if tc.uid == "tags" && len(rest) != 0 {
			t.Errorf("dump of tags: lines past its broadcast state: %q", rest)
		}
		if tc.uid == "limits" {
			// "names" (int64 keys) then the keyed state, ann 2 and bob 1.
			names, keyed := map[string]string{}, map[string]string{}
			for _, l := range rest {
				var r struct {
					Broadcast string          `json:"broadcast_state"`
					State     string          `json:"state"`
					Key       json.RawMessage `json:"key"`
					Value     json.RawMessage `json:"value"`
				}
				if err := json.Unmarshal([]byte(l), &r); err != nil {
					t.Fatalf("line %s: %v", l, err)
				}
				switch {
				case r.Broadcast == "names" && len(keyed) == 0:
					names[string(r.Key)] = string(r.Value)
				case r.State == "clicks":
					keyed[string(r.Key)] = string(r.Value)
				default:
					t.Fatalf("line %s", l)
				}
			}
			if fmt.Sprint(names) != `map[10:"bronze" 100:"gold" 120:"gold" 50:"silver"]` || fmt.Sprint(keyed) != `map["ann":2 "bob":1]` {
				t.Errorf("names %v, keyed %v", names, keyed)
			}
		}
	}
	out, _ := run("state", "dump", sp, "--operator", "limits", "--state", "names")
	if got := lines(out); len(got) != 4 || !strings.Contains(got[0], `"broadcast_state":"names"`) {
		t.Errorf("dump --state names:\n%s", out)
	}

	var in inspection
	out, _ = run("savepoint", "inspect", "-o", "json", sp)
	if err := json.Unmarshal([]byte(out), &in); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, o := range in.Operators {
		if o.BroadcastError != "" {
			t.Errorf("%s: %s", o.UID, o.BroadcastError)
		}
		for _, s := range o.BroadcastStates {
			got[o.UID+"/"+s.Name] = fmt.Sprintf("%d entries, %t", s.Entries, s.Bytes > 0)
		}
	}
	if fmt.Sprint(got) != "map[limits/limits:3 entries, true limits/names:4 entries, true tags/tags:3 entries, true]" {
		t.Errorf("inspected broadcast states %v", got)
	}
	table, _ := run("savepoint", "inspect", sp)
	if !strings.Contains(table, "BROADCAST STATE") || !strings.Contains(table, "  names") {
		t.Errorf("inspect table:\n%s", table)
	}

	// Without a job type: no broadcast state shown, a note says why.
	out, errOut := run("state", "dump", bare, "--operator", "tags")
	if strings.TrimSpace(out) != "" || !strings.Contains(errOut, "broadcast state") {
		t.Errorf("dump without a job type: %q, stderr %q", out, errOut)
	}
	out, _ = run("savepoint", "inspect", "-o", "json", bare)
	if strings.Contains(out, "broadcast_states") {
		t.Errorf("inspect without a job type guessed broadcast state:\n%s", out)
	}
}
