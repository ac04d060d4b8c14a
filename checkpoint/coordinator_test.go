package checkpoint

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func testConfig() CoordinatorConfig {
	return CoordinatorConfig{
		Job:      "job-1",
		Interval: 10 * time.Second,
		Timeout:  30 * time.Second,
		Tasks:    []TaskID{"src#0", "src#1", "sink#0"},
		Sources:  []TaskID{"src#0", "src#1"},
		// Most tests drive early triggers back to back; the pause has its
		// own tests.
		MinPause: NoMinPause,
	}
}

// harness wraps a Coordinator with a fake durable id source.
type harness struct {
	t      *testing.T
	c      *Coordinator
	nextID ID
}

func newHarness(t *testing.T, cfg CoordinatorConfig) *harness {
	t.Helper()
	c, err := NewCoordinator(cfg)
	if err != nil {
		t.Fatalf("NewCoordinator: %v", err)
	}
	return &harness{t: t, c: c, nextID: 1}
}

func (h *harness) step(ev Event) []Action { return h.c.Step(ev) }

// answerID feeds the next id from the fake id source and returns the Trigger.
func (h *harness) answerID(now time.Time) Trigger {
	h.t.Helper()
	id := h.nextID
	h.nextID++
	acts := h.step(IDAssigned{ID: id, Now: now})
	tr, ok := only[Trigger](acts)
	if !ok {
		h.t.Fatalf("IDAssigned(%d): want one Trigger, got %#v", id, acts)
	}
	return tr
}

// trigger asks for an early checkpoint at now and returns its id.
func (h *harness) trigger(now time.Time) ID {
	h.t.Helper()
	acts := h.step(TriggerNow{Now: now, Reason: "test"})
	if _, ok := only[RequestID](acts); !ok {
		h.t.Fatalf("TriggerNow at %v: want one RequestID, got %#v", now.Sub(t0), acts)
	}
	return h.answerID(now).ID
}

// ackAll acks id from every task at now and returns the last Step's actions.
func (h *harness) ackAll(id ID, now time.Time) []Action {
	var acts []Action
	for _, task := range h.c.cfg.Tasks {
		acts = h.step(Ack{Task: task, ID: id, Snapshot: snap(task, 10), Now: now})
	}
	return acts
}

// complete acks id from every task and persists it successfully; it returns
// the actions of Persisted.
func (h *harness) complete(id ID, now time.Time) []Action {
	h.t.Helper()
	acts := h.ackAll(id, now)
	if p, ok := only[Persist](acts); !ok || p.Completed.ID != id {
		h.t.Fatalf("acking %d: want Persist, got %#v", id, acts)
	}
	acts = h.step(Persisted{ID: id, Now: now})
	if !slices.Contains(acts, Action(NotifyComplete{ID: id})) {
		h.t.Fatalf("Persisted(%d): want NotifyComplete, got %#v", id, acts)
	}
	return acts
}

func snap(task TaskID, size int) TaskSnapshot {
	return TaskSnapshot{Task: task, Operators: []OperatorSnapshot{{
		UID:   "op",
		State: [][]byte{make([]byte, size)},
	}}}
}

func filter[T Action](acts []Action) []T {
	var out []T
	for _, a := range acts {
		if x, ok := a.(T); ok {
			out = append(out, x)
		}
	}
	return out
}

// only reports the single action of acts if it is a T.
func only[T Action](acts []Action) (T, bool) {
	var zero T
	if len(acts) != 1 {
		return zero, false
	}
	x, ok := acts[0].(T)
	return x, ok
}

func TestNewCoordinatorRejectsInvalidConfig(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*CoordinatorConfig)
	}{
		{"empty job", func(c *CoordinatorConfig) { c.Job = "" }},
		{"zero interval", func(c *CoordinatorConfig) { c.Interval = 0 }},
		{"zero timeout", func(c *CoordinatorConfig) { c.Timeout = 0 }},
		{"negative max concurrent", func(c *CoordinatorConfig) { c.MaxConcurrent = -1 }},
		{"no tasks", func(c *CoordinatorConfig) { c.Tasks = nil }},
		{"no sources", func(c *CoordinatorConfig) { c.Sources = nil }},
		{"duplicate task", func(c *CoordinatorConfig) { c.Tasks = append(c.Tasks, "src#0") }},
		{"source not a task", func(c *CoordinatorConfig) { c.Sources = []TaskID{"other"} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			tt.modify(&cfg)
			if _, err := NewCoordinator(cfg); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("err = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

func TestCoordinatorTriggersOnInterval(t *testing.T) {
	h := newHarness(t, testConfig())
	if acts := h.step(Tick{Now: at(0)}); len(acts) != 0 {
		t.Fatalf("first tick: got %#v, want nothing", acts)
	}
	if acts := h.step(Tick{Now: at(9 * time.Second)}); len(acts) != 0 {
		t.Fatalf("tick before interval: got %#v, want nothing", acts)
	}
	acts := h.step(Tick{Now: at(10 * time.Second)})
	if r, ok := only[RequestID](acts); !ok || r.Reason != "periodic" {
		t.Fatalf("tick at interval: got %#v, want RequestID{periodic}", acts)
	}
	tr := h.answerID(at(10 * time.Second))
	if tr.ID != 1 || !slices.Equal(tr.Sources, []TaskID{"src#0", "src#1"}) || !tr.At.Equal(at(10*time.Second)) {
		t.Fatalf("Trigger = %#v", tr)
	}
	h.complete(1, at(11*time.Second))
	// Ticks were dropped for a long time: exactly one trigger, no catch-up.
	acts = h.step(Tick{Now: at(95 * time.Second)})
	if _, ok := only[RequestID](acts); !ok {
		t.Fatalf("late tick: got %#v, want one RequestID", acts)
	}
	h.answerID(at(95 * time.Second))
	if acts := h.step(Tick{Now: at(96 * time.Second)}); len(acts) != 0 {
		t.Fatalf("tick right after a trigger: got %#v, want nothing", acts)
	}
}

func TestCoordinatorHonoursMinPause(t *testing.T) {
	tests := []struct {
		name      string
		minPause  time.Duration
		early     bool          // TriggerNow instead of Tick
		after     time.Duration // time after the end of checkpoint 1
		wantReqID bool
	}{
		{"periodic due inside pause", 8 * time.Second, false, 7 * time.Second, false},
		{"periodic after pause", 8 * time.Second, false, 8 * time.Second, true},
		{"early inside pause", 8 * time.Second, true, 7 * time.Second, false},
		{"early after pause", 8 * time.Second, true, 8 * time.Second, true},
		{"early without pause", NoMinPause, true, 0, true},
		// The default pause (0) is the interval, 10s.
		{"periodic due inside the default pause", 0, false, 6 * time.Second, false},
		{"periodic after the default pause", 0, false, 10 * time.Second, true},
		{"early inside the default pause", 0, true, 9 * time.Second, false},
		{"early after the default pause", 0, true, 10 * time.Second, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.MinPause = tt.minPause
			h := newHarness(t, cfg)
			h.step(Tick{Now: at(0)})
			id := h.trigger(at(time.Second))
			end := at(5 * time.Second) // the interval is due at 11s
			h.complete(id, end)
			var acts []Action
			if tt.early {
				acts = h.step(TriggerNow{Now: end.Add(tt.after), Reason: "lanes full"})
			} else {
				acts = h.step(Tick{Now: end.Add(tt.after)})
			}
			_, got := only[RequestID](acts)
			if got != tt.wantReqID {
				t.Fatalf("got %#v, want RequestID: %v", acts, tt.wantReqID)
			}
		})
	}
}

func TestCoordinatorEarlyTriggerWaitsForPauseThenFires(t *testing.T) {
	cfg := testConfig()
	cfg.MinPause = 5 * time.Second
	h := newHarness(t, cfg)
	id := h.trigger(at(0))
	h.complete(id, at(time.Second))
	if acts := h.step(TriggerNow{Now: at(2 * time.Second), Reason: "lanes full"}); len(acts) != 0 {
		t.Fatalf("inside pause: got %#v", acts)
	}
	acts := h.step(Tick{Now: at(6 * time.Second)})
	if r, ok := only[RequestID](acts); !ok || r.Reason != "lanes full" {
		t.Fatalf("remembered early trigger: got %#v, want RequestID{lanes full}", acts)
	}
}

func TestCoordinatorRespectsMaxConcurrent(t *testing.T) {
	for _, maxc := range []int{0, 1, 2, 3} {
		t.Run(fmt.Sprint(maxc), func(t *testing.T) {
			cfg := testConfig()
			cfg.MaxConcurrent = maxc
			want := max(maxc, 1)
			h := newHarness(t, cfg)
			h.step(Tick{Now: at(0)})
			for i := range want {
				h.trigger(at(time.Duration(i) * time.Second))
			}
			now := time.Duration(want-1)*time.Second + cfg.Interval
			if acts := h.step(Tick{Now: at(now)}); len(acts) != 0 {
				t.Fatalf("%d in flight, interval due: got %#v, want nothing", want, acts)
			}
			if acts := h.step(TriggerNow{Now: at(now), Reason: "early"}); len(acts) != 0 {
				t.Fatalf("%d in flight, early: got %#v, want nothing", want, acts)
			}
			if n := len(h.c.Pending()); n != want {
				t.Fatalf("Pending() has %d, want %d", n, want)
			}
			// Completing the last subsumes the others; the remembered early
			// request fires as soon as the slots are free.
			acts := h.complete(ID(want), at(now))
			if r := filter[RequestID](acts); len(r) != 1 || r[0].Reason != "early" {
				t.Fatalf("completion: got %#v, want a RequestID{early}", acts)
			}
		})
	}
}

func TestCoordinatorNotifiesCompleteOnlyAfterPersisted(t *testing.T) {
	h := newHarness(t, testConfig())
	id := h.trigger(at(0))
	tasks := h.c.cfg.Tasks
	for i, task := range tasks[:len(tasks)-1] {
		acts := h.step(Ack{Task: task, ID: id, Snapshot: snap(task, 10*(i+1)), Alignment: time.Duration(i) * time.Millisecond, Now: at(time.Duration(i+1) * time.Second)})
		if len(acts) != 0 {
			t.Fatalf("ack %d of %d: got %#v, want nothing", i+1, len(tasks), acts)
		}
	}
	last := tasks[len(tasks)-1]
	acts := h.step(Ack{Task: last, ID: id, Snapshot: snap(last, 5), Alignment: 7 * time.Millisecond, Now: at(4 * time.Second)})
	p, ok := only[Persist](acts)
	if !ok {
		t.Fatalf("last ack: got %#v, want Persist", acts)
	}
	c := p.Completed
	if c.Job != "job-1" || c.ID != id || !c.TriggeredAt.Equal(at(0)) || !c.CompletedAt.Equal(at(4*time.Second)) || len(c.Tasks) != 3 {
		t.Fatalf("Completed = %+v", c)
	}
	wantStats := map[TaskID]TaskStats{
		"src#0":  {AckLatency: time.Second, Alignment: 0, Size: 10},
		"src#1":  {AckLatency: 2 * time.Second, Alignment: time.Millisecond, Size: 20},
		"sink#0": {AckLatency: 4 * time.Second, Alignment: 7 * time.Millisecond, Size: 5},
	}
	for task, want := range wantStats {
		if got := c.Stats[task]; got != want {
			t.Errorf("Stats[%s] = %+v, want %+v", task, got, want)
		}
	}
	if c.Size() != 35 {
		t.Errorf("Size() = %d, want 35", c.Size())
	}
	// Time passes, ticks come, the persist is slow: no NotifyComplete, no
	// timeout, no new trigger (max concurrent 1).
	for _, d := range []time.Duration{10 * time.Second, 40 * time.Second, 100 * time.Second} {
		if acts := h.step(Tick{Now: at(d)}); len(acts) != 0 {
			t.Fatalf("tick at %v while persisting: got %#v, want nothing", d, acts)
		}
	}
	if ps := h.c.Pending(); len(ps) != 1 || ps[0].Phase != PhasePersisting {
		t.Fatalf("Pending() = %+v, want one persisting", ps)
	}
	acts = h.step(Persisted{ID: id, Now: at(101 * time.Second)})
	if len(acts) < 1 || acts[0] != (NotifyComplete{ID: id}) {
		t.Fatalf("Persisted: got %#v, want NotifyComplete first", acts)
	}
	if h.c.LastCompleted() != id {
		t.Fatalf("LastCompleted() = %d, want %d", h.c.LastCompleted(), id)
	}
}

func TestCoordinatorAbortsOnTimeout(t *testing.T) {
	h := newHarness(t, testConfig())
	id := h.trigger(at(0))
	h.step(Ack{Task: "src#0", ID: id, Now: at(time.Second)})
	if acts := h.step(Tick{Now: at(29 * time.Second)}); len(acts) != 0 {
		t.Fatalf("before timeout: got %#v", acts)
	}
	acts := h.step(Tick{Now: at(30 * time.Second)})
	ab := filter[NotifyAborted](acts)
	if len(ab) != 1 || ab[0].ID != id || !errors.Is(ab[0].Reason, ErrTimeout) {
		t.Fatalf("at timeout: got %#v, want NotifyAborted(ErrTimeout)", acts)
	}
	if h.c.ConsecutiveFailures() != 1 {
		t.Fatalf("failures = %d, want 1", h.c.ConsecutiveFailures())
	}
	// An ack after the timeout is ignored.
	if acts := h.step(Ack{Task: "src#1", ID: id, Now: at(31 * time.Second)}); len(filter[Persist](acts)) != 0 {
		t.Fatalf("late ack: got %#v", acts)
	}
}

func TestCoordinatorDeclineAbortsAndCounts(t *testing.T) {
	conflict := errors.New("zombie marker")
	tests := []struct {
		name string
		err  error
	}{
		{"nil error", nil},
		{"plain error", conflict},
		{"wrapping ErrDeclined", fmt.Errorf("%w: %w", ErrDeclined, conflict)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, testConfig())
			id := h.trigger(at(0))
			acts := h.step(Decline{Task: "sink#0", ID: id, Err: tt.err, Now: at(time.Second)})
			ab, ok := only[NotifyAborted](acts)
			if !ok || ab.ID != id || !errors.Is(ab.Reason, ErrDeclined) {
				t.Fatalf("got %#v, want NotifyAborted(ErrDeclined)", acts)
			}
			if tt.err != nil && !errors.Is(ab.Reason, conflict) {
				t.Fatalf("reason %v does not wrap the task's error", ab.Reason)
			}
			if h.c.ConsecutiveFailures() != 1 || len(h.c.Pending()) != 0 {
				t.Fatalf("failures = %d, pending = %v", h.c.ConsecutiveFailures(), h.c.Pending())
			}
		})
	}
}

// failOne makes one checkpoint fail in the given way and returns the actions.
type failure func(h *harness, now time.Time) []Action

var failures = map[string]failure{
	"decline": func(h *harness, now time.Time) []Action {
		id := h.trigger(now)
		return h.step(Decline{Task: "src#0", ID: id, Now: now})
	},
	"timeout": func(h *harness, now time.Time) []Action {
		h.trigger(now)
		return h.step(Tick{Now: now.Add(h.c.cfg.Timeout)})
	},
	"persist error": func(h *harness, now time.Time) []Action {
		id := h.trigger(now)
		h.ackAll(id, now)
		return h.step(Persisted{ID: id, Err: errors.New("disk full"), Now: now})
	},
	"trigger error": func(h *harness, now time.Time) []Action {
		id := h.trigger(now)
		return h.step(TriggerFailed{ID: id, Err: errors.New("no route"), Now: now})
	},
	"id error": func(h *harness, now time.Time) []Action {
		if _, ok := only[RequestID](h.step(TriggerNow{Now: now})); !ok {
			h.t.Fatal("no RequestID")
		}
		return h.step(IDAssigned{Err: errors.New("store closed"), Now: now})
	},
}

func TestCoordinatorFailsJobPastTolerableFailures(t *testing.T) {
	tests := []struct {
		tolerable int
		wantFails int // failures until FailJob
	}{
		{tolerable: -1, wantFails: 1},
		{tolerable: 0, wantFails: DefaultTolerableFailures + 1},
		{tolerable: 2, wantFails: 3},
	}
	for name, fail := range failures {
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s/tolerable=%d", name, tt.tolerable), func(t *testing.T) {
				cfg := testConfig()
				cfg.Interval = time.Hour // only the failures trigger
				cfg.TolerableFailures = tt.tolerable
				h := newHarness(t, cfg)
				now := time.Duration(0)
				for i := 1; i <= tt.wantFails; i++ {
					now += time.Minute
					acts := fail(h, at(now))
					fj := filter[FailJob](acts)
					if i < tt.wantFails && len(fj) != 0 {
						t.Fatalf("failure %d: early FailJob %v", i, fj)
					}
					if i == tt.wantFails && (len(fj) != 1 || !errors.Is(fj[0].Err, ErrTooManyFailures)) {
						t.Fatalf("failure %d: got %#v, want FailJob(ErrTooManyFailures)", i, acts)
					}
				}
				// Halted: nothing triggers until Restored.
				now += time.Hour
				if acts := h.step(TriggerNow{Now: at(now)}); len(acts) != 0 {
					t.Fatalf("after FailJob: got %#v, want nothing", acts)
				}
				h.step(Restored{LastCompleted: 0, Now: at(now)})
				if h.c.ConsecutiveFailures() != 0 {
					t.Fatalf("failures after Restored = %d", h.c.ConsecutiveFailures())
				}
				h.trigger(at(now))
			})
		}
	}
}

func TestCoordinatorCompletionResetsFailureCount(t *testing.T) {
	cfg := testConfig()
	cfg.TolerableFailures = 1
	h := newHarness(t, cfg)
	now := time.Duration(0)
	for round := range 3 {
		now += time.Minute
		if fj := filter[FailJob](failures["decline"](h, at(now))); len(fj) != 0 {
			t.Fatalf("round %d: FailJob after one failure", round)
		}
		now += time.Minute
		h.complete(h.trigger(at(now)), at(now))
		if h.c.ConsecutiveFailures() != 0 {
			t.Fatalf("round %d: failures = %d after completion", round, h.c.ConsecutiveFailures())
		}
	}
}

func TestCoordinatorSubsumesEarlierCheckpoints(t *testing.T) {
	cfg := testConfig()
	cfg.MaxConcurrent = 3
	h := newHarness(t, cfg)
	a := h.trigger(at(0))
	b := h.trigger(at(time.Second))
	c := h.trigger(at(2 * time.Second))
	h.step(Ack{Task: "src#0", ID: a, Now: at(3 * time.Second)})
	acts := h.ackAll(b, at(3*time.Second))
	if _, ok := only[Persist](acts); !ok {
		t.Fatalf("acking b: got %#v", acts)
	}
	acts = h.step(Persisted{ID: b, Now: at(4 * time.Second)})
	want := []Action{NotifyComplete{ID: b}}
	if len(acts) != 2 || acts[0] != want[0] {
		t.Fatalf("got %#v, want NotifyComplete(b) then NotifyAborted(a)", acts)
	}
	if ab, ok := acts[1].(NotifyAborted); !ok || ab.ID != a || !errors.Is(ab.Reason, ErrSubsumed) {
		t.Fatalf("second action %#v, want NotifyAborted(a, ErrSubsumed)", acts[1])
	}
	if h.c.ConsecutiveFailures() != 0 {
		t.Fatal("subsumption counted as a failure")
	}
	if ps := h.c.Pending(); len(ps) != 1 || ps[0].ID != c {
		t.Fatalf("Pending() = %+v, want only %d", ps, c)
	}
}

func TestCoordinatorPersistsInIDOrder(t *testing.T) {
	cfg := testConfig()
	cfg.MaxConcurrent = 2
	h := newHarness(t, cfg)
	a := h.trigger(at(0))
	b := h.trigger(at(time.Second))
	if p, ok := only[Persist](h.ackAll(a, at(2*time.Second))); !ok || p.Completed.ID != a {
		t.Fatal("a not persisted")
	}
	if acts := h.ackAll(b, at(2*time.Second)); len(acts) != 0 {
		t.Fatalf("b acked while a persists: got %#v, want nothing (queued)", acts)
	}
	if ps := h.c.Pending(); len(ps) != 2 || ps[1].Phase != PhaseQueued {
		t.Fatalf("Pending() = %+v, want b queued", ps)
	}
	acts := h.step(Persisted{ID: a, Err: errors.New("io"), Now: at(3 * time.Second)})
	if len(acts) != 2 || acts[0].(NotifyAborted).ID != a || acts[1].(Persist).Completed.ID != b {
		t.Fatalf("got %#v, want NotifyAborted(a), Persist(b)", acts)
	}
}

func TestCoordinatorIgnoresLateDuplicateAndUnknownAcks(t *testing.T) {
	type setup struct {
		h  *harness
		id ID // a collecting checkpoint with src#0 acked
		ab ID // an aborted checkpoint
		ok ID // a completed checkpoint
	}
	tests := []struct {
		name string
		ev   func(s setup) Event
	}{
		{"unknown id", func(s setup) Event { return Ack{Task: "src#1", ID: 99, Now: at(10 * time.Second)} }},
		{"id zero", func(s setup) Event { return Ack{Task: "src#1", ID: 0, Now: at(10 * time.Second)} }},
		{"aborted id", func(s setup) Event { return Ack{Task: "src#1", ID: s.ab, Now: at(10 * time.Second)} }},
		{"completed id", func(s setup) Event { return Ack{Task: "src#1", ID: s.ok, Now: at(10 * time.Second)} }},
		{"unknown task", func(s setup) Event { return Ack{Task: "ghost", ID: s.id, Now: at(10 * time.Second)} }},
		{"duplicate ack", func(s setup) Event {
			return Ack{Task: "src#0", ID: s.id, Snapshot: snap("src#0", 999), Now: at(10 * time.Second)}
		}},
		{"decline after own ack", func(s setup) Event { return Decline{Task: "src#0", ID: s.id, Now: at(10 * time.Second)} }},
		{"decline unknown id", func(s setup) Event { return Decline{Task: "src#1", ID: 99, Now: at(10 * time.Second)} }},
		{"decline unknown task", func(s setup) Event { return Decline{Task: "ghost", ID: s.id, Now: at(10 * time.Second)} }},
		{"persisted not persisting", func(s setup) Event { return Persisted{ID: s.id, Now: at(10 * time.Second)} }},
		{"persisted completed", func(s setup) Event { return Persisted{ID: s.ok, Now: at(10 * time.Second)} }},
		{"trigger failed unknown", func(s setup) Event { return TriggerFailed{ID: 99, Now: at(10 * time.Second)} }},
		{"id not requested", func(s setup) Event { return IDAssigned{ID: 100, Now: at(10 * time.Second)} }},
		{"nil event", func(s setup) Event { return nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Interval = time.Hour
			h := newHarness(t, cfg)
			ok := h.trigger(at(0))
			h.complete(ok, at(time.Second))
			ab := h.trigger(at(2 * time.Second))
			h.step(Decline{Task: "sink#0", ID: ab, Now: at(3 * time.Second)})
			id := h.trigger(at(4 * time.Second))
			h.step(Ack{Task: "src#0", ID: id, Snapshot: snap("src#0", 1), Now: at(5 * time.Second)})
			before := h.c.Pending()
			fails := h.c.ConsecutiveFailures()

			if acts := h.step(tt.ev(setup{h: h, id: id, ab: ab, ok: ok})); len(acts) != 0 {
				t.Fatalf("got %#v, want nothing", acts)
			}
			if acts := h.step(tt.ev(setup{h: h, id: id, ab: ab, ok: ok})); len(acts) != 0 {
				t.Fatalf("got %#v, want nothing", acts)
			}
			after := h.c.Pending()
			if len(after) != 1 || !slices.Equal(after[0].Acked, before[0].Acked) || after[0].Stats["src#0"] != before[0].Stats["src#0"] {
				t.Fatalf("pending changed: before %+v, after %+v", before, after)
			}
			if h.c.ConsecutiveFailures() != fails {
				t.Fatal("failure count changed")
			}
			// The checkpoint still completes with the first snapshot.
			h.step(Ack{Task: "src#1", ID: id, Now: at(6 * time.Second)})
			p, isP := only[Persist](h.step(Ack{Task: "sink#0", ID: id, Now: at(6 * time.Second)}))
			if !isP || p.Completed.Tasks["src#0"].Size() != 1 {
				t.Fatalf("want Persist with the first snapshot of src#0, got %+v", p)
			}
		})
	}
}

func TestCoordinatorFailedPersistAbortsAndCounts(t *testing.T) {
	h := newHarness(t, testConfig())
	id := h.trigger(at(0))
	h.ackAll(id, at(time.Second))
	diskErr := errors.New("disk full")
	acts := h.step(Persisted{ID: id, Err: diskErr, Now: at(2 * time.Second)})
	ab, ok := only[NotifyAborted](acts)
	if !ok || ab.ID != id || !errors.Is(ab.Reason, ErrPersistFailed) || !errors.Is(ab.Reason, diskErr) {
		t.Fatalf("got %#v, want NotifyAborted(ErrPersistFailed)", acts)
	}
	if h.c.ConsecutiveFailures() != 1 || h.c.LastCompleted() != 0 {
		t.Fatalf("failures %d, last completed %d", h.c.ConsecutiveFailures(), h.c.LastCompleted())
	}
}

func TestCoordinatorUnknownPersistOutcomeFailsJobWithoutAbort(t *testing.T) {
	cfg := testConfig()
	cfg.MaxConcurrent = 2
	h := newHarness(t, cfg)
	id := h.trigger(at(0))
	other := h.trigger(at(time.Second))
	h.ackAll(id, at(2*time.Second))
	acts := h.step(Persisted{ID: id, Err: fmt.Errorf("sync: %w", ErrOutcomeUnknown), Now: at(3 * time.Second)})
	if len(acts) != 2 {
		t.Fatalf("got %#v, want FailJob and NotifyAborted(other)", acts)
	}
	if fj, ok := acts[0].(FailJob); !ok || !errors.Is(fj.Err, ErrOutcomeUnknown) {
		t.Fatalf("first action %#v, want FailJob(ErrOutcomeUnknown)", acts[0])
	}
	if ab, ok := acts[1].(NotifyAborted); !ok || ab.ID != other || !errors.Is(ab.Reason, ErrJobFailover) {
		t.Fatalf("second action %#v, want NotifyAborted(other)", acts[1])
	}
}

func TestCoordinatorDoesNotWaitForNotifications(t *testing.T) {
	// Notifications are never acknowledged: dropping every one of them,
	// checkpoints keep completing and new ones keep triggering.
	h := newHarness(t, testConfig())
	h.step(Tick{Now: at(0)})
	for i := range 5 {
		now := at(time.Duration(i+1) * 10 * time.Second)
		acts := h.step(Tick{Now: now})
		if _, ok := only[RequestID](acts); !ok {
			t.Fatalf("round %d: got %#v, want RequestID", i, acts)
		}
		id := h.answerID(now).ID
		h.ackAll(id, now)
		if acts := h.step(Persisted{ID: id, Now: now}); len(filter[NotifyComplete](acts)) != 1 {
			t.Fatalf("round %d: no NotifyComplete", i)
		} // and drop it
	}
	if h.c.LastCompleted() != 5 {
		t.Fatalf("LastCompleted() = %d, want 5", h.c.LastCompleted())
	}
}

func TestCoordinatorIDsIncreaseAcrossRestarts(t *testing.T) {
	h := newHarness(t, testConfig())
	id := h.trigger(at(0))
	h.complete(id, at(time.Second))
	h.trigger(at(2 * time.Second)) // 2, never completes: the job manager dies

	// A new coordinator (new job manager process) restored from 1; the
	// durable id source continues at 3.
	h2 := newHarness(t, testConfig())
	h2.nextID = h.nextID
	h2.step(Restored{LastCompleted: id, Now: at(10 * time.Second)})
	if got := h2.trigger(at(time.Minute)); got != 3 {
		t.Fatalf("first id after restart = %d, want 3", got)
	}

	// An id source that went backwards is refused: no trigger, FailJob.
	h3 := newHarness(t, testConfig())
	h3.step(Restored{LastCompleted: 7, Now: at(0)})
	h3.step(TriggerNow{Now: at(0)})
	acts := h3.step(IDAssigned{ID: 7, Now: at(0)})
	if len(filter[Trigger](acts)) != 0 {
		t.Fatalf("stale id triggered: %#v", acts)
	}
	if fj, ok := only[FailJob](acts); !ok || !errors.Is(fj.Err, ErrIDNotIncreasing) {
		t.Fatalf("got %#v, want FailJob(ErrIDNotIncreasing)", acts)
	}
}

func TestCoordinatorTaskFailedAbortsAllPending(t *testing.T) {
	cfg := testConfig()
	cfg.MaxConcurrent = 4
	h := newHarness(t, cfg)
	persisting := h.trigger(at(0))
	h.ackAll(persisting, at(time.Second))
	a := h.trigger(at(2 * time.Second))
	b := h.trigger(at(3 * time.Second))
	h.step(TriggerNow{Now: at(4 * time.Second)}) // id request outstanding
	crash := errors.New("task lost")
	acts := h.step(TaskFailed{Err: crash, Now: at(5 * time.Second)})
	var aborted []ID
	for _, ab := range filter[NotifyAborted](acts) {
		if !errors.Is(ab.Reason, ErrJobFailover) || !errors.Is(ab.Reason, crash) {
			t.Fatalf("reason %v", ab.Reason)
		}
		aborted = append(aborted, ab.ID)
	}
	if !slices.Equal(aborted, []ID{a, b}) || len(acts) != 2 {
		t.Fatalf("got %#v, want NotifyAborted for %d and %d only", acts, a, b)
	}
	if h.c.ConsecutiveFailures() != 0 {
		t.Fatal("task failure counted as checkpoint failure")
	}
	// The id that arrives for the outstanding request is burnt.
	if acts := h.step(IDAssigned{ID: h.nextID, Now: at(6 * time.Second)}); len(acts) != 0 {
		t.Fatalf("id after TaskFailed: got %#v", acts)
	}
	// The persisting checkpoint still completes: its fate is the store's.
	if acts := h.step(Persisted{ID: persisting, Now: at(7 * time.Second)}); !slices.Equal(acts, []Action{NotifyComplete{ID: persisting}}) {
		t.Fatalf("Persisted: got %#v", acts)
	}
	if acts := h.step(Tick{Now: at(time.Hour)}); len(acts) != 0 {
		t.Fatalf("trigger before Restored: %#v", acts)
	}
	h.step(Restored{LastCompleted: persisting, Now: at(time.Hour)})
	h.nextID++
	if id := h.trigger(at(time.Hour)); id <= b+1 {
		t.Fatalf("id after restore %d, want > %d", id, b+1)
	}
}

func TestCoordinatorPendingInfo(t *testing.T) {
	h := newHarness(t, testConfig())
	id := h.trigger(at(0))
	h.step(Ack{Task: "src#1", ID: id, Snapshot: snap("src#1", 3), Alignment: time.Millisecond, Now: at(2 * time.Second)})
	ps := h.c.Pending()
	if len(ps) != 1 {
		t.Fatalf("Pending() = %+v", ps)
	}
	p := ps[0]
	if p.ID != id || p.Phase != PhaseCollecting || p.Reason != "test" || !p.TriggeredAt.Equal(at(0)) || !p.Deadline.Equal(at(30*time.Second)) {
		t.Fatalf("PendingInfo = %+v", p)
	}
	if !slices.Equal(p.Acked, []TaskID{"src#1"}) || !slices.Equal(p.Waiting, []TaskID{"sink#0", "src#0"}) {
		t.Fatalf("acked %v waiting %v", p.Acked, p.Waiting)
	}
	if p.Stats["src#1"] != (TaskStats{AckLatency: 2 * time.Second, Alignment: time.Millisecond, Size: 3}) {
		t.Fatalf("stats %+v", p.Stats)
	}
}

// TestCoordinatorInvariantsUnderRandomEvents drives the coordinator with
// random event sequences (a simulated caller answering its actions late,
// wrongly or never) and checks the protocol's invariants on every action.
func TestCoordinatorInvariantsUnderRandomEvents(t *testing.T) {
	const seeds, steps = 300, 400
	var total runStats
	for seed := range uint64(seeds) {
		st := checkRandomRun(t, seed, steps)
		total.completed += st.completed
		for k, v := range st.aborted {
			if total.aborted == nil {
				total.aborted = map[error]int{}
			}
			total.aborted[k] += v
		}
		total.failJobs += st.failJobs
	}
	// The generator must reach every outcome, or the invariants prove little.
	t.Logf("completed %d, aborted %v, FailJob %d", total.completed, total.aborted, total.failJobs)
	if total.completed < seeds {
		t.Errorf("only %d completions over %d seeds", total.completed, seeds)
	}
	for _, reason := range []error{ErrTimeout, ErrDeclined, ErrSubsumed, ErrJobFailover, ErrPersistFailed, ErrTriggerFailed} {
		if total.aborted[reason] == 0 {
			t.Errorf("no abort for %v", reason)
		}
	}
	if total.failJobs == 0 {
		t.Error("no FailJob")
	}
}

type runStats struct {
	completed int
	aborted   map[error]int
	failJobs  int
}

func checkRandomRun(t *testing.T, seed uint64, steps int) runStats {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 42))
	cfg := testConfig()
	cfg.MaxConcurrent = 1 + rng.IntN(3)
	cfg.MinPause = time.Duration(rng.IntN(4)-1) * time.Second // NoMinPause, the default, 1s, 2s
	cfg.TolerableFailures = rng.IntN(4) - 1
	c, err := NewCoordinator(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fatalf := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d: "+format, append([]any{seed}, args...)...)
	}

	var (
		now         = t0
		storeNext   = ID(1) // the durable id source
		storeLast   = ID(0) // latest checkpoint in the store
		lastTrigger ID
		requested   bool
		persisting  = map[ID]bool{} // Persist returned, Persisted not yet fed
		persistedOK = map[ID]bool{}
		triggered   = map[ID]bool{}
		acked       = map[ID]map[TaskID]bool{}
		completed   = map[ID]bool{}
		aborted     = map[ID]bool{}
		lastEnd     time.Time
		hasEnd      bool
		inFlight    = map[ID]bool{}
		stats       = runStats{aborted: map[error]int{}}
		pendingIDs  []ID // ids handed out, for acks (some stale)
	)
	check := func(acts []Action) {
		for _, a := range acts {
			switch a := a.(type) {
			case RequestID:
				if requested {
					fatalf("RequestID while one is outstanding")
				}
				if len(inFlight) >= cfg.MaxConcurrent {
					fatalf("RequestID with %d in flight, max %d", len(inFlight), cfg.MaxConcurrent)
				}
				if hasEnd && now.Before(lastEnd.Add(EffectiveMinPause(cfg.MinPause, cfg.Interval))) {
					fatalf("RequestID at %v, inside MinPause after %v", now, lastEnd)
				}
				requested = true
			case Trigger:
				if a.ID <= lastTrigger {
					fatalf("Trigger %d after %d: ids must strictly increase", a.ID, lastTrigger)
				}
				lastTrigger = a.ID
				triggered[a.ID] = true
				inFlight[a.ID] = true
				pendingIDs = append(pendingIDs, a.ID)
			case Persist:
				id := a.Completed.ID
				if len(persisting) != 0 {
					fatalf("Persist %d while %v persists", id, persisting)
				}
				if !triggered[id] || completed[id] || aborted[id] {
					fatalf("Persist of %d: triggered %v completed %v aborted %v", id, triggered[id], completed[id], aborted[id])
				}
				for _, task := range cfg.Tasks {
					if !acked[id][task] {
						fatalf("Persist of %d without an ack from %s", id, task)
					}
					if _, ok := a.Completed.Tasks[task]; !ok {
						fatalf("Persist of %d lacks task %s", id, task)
					}
				}
				persisting[id] = true
			case NotifyComplete:
				if !persistedOK[a.ID] {
					fatalf("NotifyComplete(%d) before Persisted ok", a.ID)
				}
				if completed[a.ID] || aborted[a.ID] {
					fatalf("NotifyComplete(%d): completed %v aborted %v", a.ID, completed[a.ID], aborted[a.ID])
				}
				completed[a.ID] = true
				stats.completed++
				delete(inFlight, a.ID)
				lastEnd, hasEnd = now, true
			case NotifyAborted:
				if !triggered[a.ID] || completed[a.ID] || aborted[a.ID] {
					fatalf("NotifyAborted(%d): triggered %v completed %v aborted %v", a.ID, triggered[a.ID], completed[a.ID], aborted[a.ID])
				}
				if persisting[a.ID] {
					fatalf("NotifyAborted(%d) while its Persist is outstanding", a.ID)
				}
				if a.Reason == nil {
					fatalf("NotifyAborted(%d) without reason", a.ID)
				}
				for _, reason := range []error{ErrTimeout, ErrDeclined, ErrSubsumed, ErrJobFailover, ErrPersistFailed, ErrTriggerFailed} {
					if errors.Is(a.Reason, reason) {
						stats.aborted[reason]++
					}
				}
				aborted[a.ID] = true
				delete(inFlight, a.ID)
				lastEnd, hasEnd = now, true
			case FailJob:
				if a.Err == nil {
					fatalf("FailJob without error")
				}
				stats.failJobs++
			}
		}
	}
	pick := func(m map[ID]bool) (ID, bool) {
		var ids []ID
		for id := range m {
			ids = append(ids, id)
		}
		if len(ids) == 0 {
			return 0, false
		}
		slices.Sort(ids)
		return ids[rng.IntN(len(ids))], true
	}
	for range steps {
		now = now.Add(time.Duration(rng.IntN(3000)) * time.Millisecond)
		var ev Event
		r := rng.IntN(100)
		if requested && rng.IntN(2) == 0 {
			r = 25 // the id source answers promptly half of the time
		}
		switch {
		case r < 15:
			ev = Tick{Now: now}
		case r < 22:
			ev = TriggerNow{Now: now, Reason: "random"}
		case r < 32 && requested:
			requested = false
			switch rng.IntN(40) {
			case 0:
				ev = IDAssigned{Err: errors.New("store down"), Now: now}
			case 1:
				ev = IDAssigned{ID: storeLast, Now: now} // a broken id source
			default:
				ev = IDAssigned{ID: storeNext, Now: now}
				storeNext++
			}
		case r < 65 && len(pendingIDs) > 0:
			id, ok := pick(inFlight)
			if !ok || rng.IntN(8) == 0 {
				id = pendingIDs[rng.IntN(len(pendingIDs))] // maybe late
			}
			if rng.IntN(20) == 0 {
				id = ID(rng.IntN(int(storeNext) + 2)) // maybe unknown
			}
			task := cfg.Tasks[rng.IntN(len(cfg.Tasks))]
			if rng.IntN(15) == 0 {
				ev = Decline{Task: task, ID: id, Err: errors.New("conflict"), Now: now}
			} else {
				ev = Ack{Task: task, ID: id, Snapshot: snap(task, rng.IntN(5)), Now: now}
				if inFlight[id] && !persisting[id] {
					if acked[id] == nil {
						acked[id] = map[TaskID]bool{}
					}
					acked[id][task] = true
				}
			}
		case r < 80:
			if id, ok := pick(persisting); ok {
				delete(persisting, id)
				var perr error
				switch rng.IntN(8) {
				case 0:
					perr = errors.New("disk full")
				case 1:
					perr = ErrOutcomeUnknown
					delete(inFlight, id) // neither completed nor aborted, by design
				default:
					persistedOK[id] = true
					storeLast = max(storeLast, id)
				}
				ev = Persisted{ID: id, Err: perr, Now: now}
			} else {
				ev = Tick{Now: now}
			}
		case r < 82:
			if id, ok := pick(inFlight); ok && !persisting[id] {
				ev = TriggerFailed{ID: id, Err: errors.New("rpc"), Now: now}
			} else {
				ev = Tick{Now: now}
			}
		case r < 84:
			ev = TaskFailed{Err: errors.New("crash"), Now: now}
		case r < 92:
			ev = Restored{LastCompleted: storeLast, Now: now}
		default:
			ev = Tick{Now: now}
		}
		check(c.Step(ev))
	}
	return stats
}

// A source that asks for a checkpoint all the time (TriggerNow after every
// event, as a share-group source with a backlog does) must not push the
// coordinator past the configured rhythm: with the default minimum pause
// (the interval) at most run/interval+1 checkpoints complete. An explicit
// pause bounds them by run/(pause+cycle)+1, and NoMinPause lets the requests
// run checkpoints back to back, as benchmarks ask for. Fake clock: the
// counts are exact, not timed.
func TestCoordinatorConstantRequestsRespectTheMinimumPause(t *testing.T) {
	const (
		interval = time.Second
		run      = 60 * time.Second
		step     = 10 * time.Millisecond
		cycle    = 50 * time.Millisecond // trigger to persisted
	)
	tests := []struct {
		name     string
		minPause time.Duration
		max, min int // bounds on completed checkpoints
	}{
		{"default pause is the interval", 0, int(run/interval) + 1, int(run/(interval+cycle+step)) - 1},
		{"explicit pause", 200 * time.Millisecond, int(run/(200*time.Millisecond+cycle)) + 1, int(run/(200*time.Millisecond+cycle+2*step)) - 1},
		{"no pause: back to back", NoMinPause, int(run/cycle) + 1, int(run/(cycle+2*step)) - 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Interval, cfg.MinPause = interval, tt.minPause
			h := newHarness(t, cfg)
			completed := map[ID]bool{}
			triggered := map[ID]time.Time{}
			var lastCompleted ID
			for now := at(0); !now.After(at(run)); now = now.Add(step) {
				// Execute the actions: ids come at once, checkpoints
				// complete one cycle after their trigger.
				execute := func(acts []Action) {
					for _, a := range acts {
						switch a := a.(type) {
						case RequestID:
							triggered[h.answerID(now).ID] = now
						case NotifyComplete:
							if completed[a.ID] || a.ID <= lastCompleted {
								t.Fatalf("checkpoint %d completed twice or out of order", a.ID)
							}
							completed[a.ID], lastCompleted = true, a.ID
						}
					}
				}
				for id, start := range triggered {
					if now.Sub(start) >= cycle {
						delete(triggered, id)
						execute(h.complete(id, now))
					}
				}
				execute(h.step(TriggerNow{Now: now, Reason: "backlog"}))
				execute(h.step(Tick{Now: now}))
			}
			if n := len(completed); n > tt.max || n < tt.min {
				t.Fatalf("%d checkpoints completed in %v with interval %v, min pause %v and %v cycles under constant requests; want %d..%d",
					n, run, interval, tt.minPause, cycle, tt.min, tt.max)
			}
		})
	}
}
