package checkpoint

// goleak runs for the whole package from TestMain in store_test.go.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// recorder is an in-memory Executor and Persister that logs every call in
// order, so tests can check what happened before what.
type recorder struct {
	mu       sync.Mutex
	log      []string
	nextID   ID
	triggers []ID
	saved    []Completed
	aborted  map[ID]error
	failed   []error
	saveErr  error
	idErr    error
	trigErr  error
}

func newRecorder() *recorder { return &recorder{nextID: 1, aborted: map[ID]error{}} }

func (r *recorder) add(format string, args ...any) {
	r.log = append(r.log, fmt.Sprintf(format, args...))
}

func (r *recorder) NextID(ctx context.Context, job string) (ID, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.idErr != nil {
		return 0, r.idErr
	}
	id := r.nextID
	r.nextID++
	r.add("id %d", id)
	return id, nil
}

func (r *recorder) Save(ctx context.Context, c Completed) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.saveErr != nil {
		r.add("save-failed %d", c.ID)
		return r.saveErr
	}
	r.saved = append(r.saved, c)
	r.add("save %d", c.ID)
	return nil
}

func (r *recorder) TriggerCheckpoint(ctx context.Context, id ID, sources []TaskID, _ bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.trigErr != nil {
		return r.trigErr
	}
	r.triggers = append(r.triggers, id)
	r.add("trigger %d", id)
	return nil
}

func (r *recorder) NotifyComplete(ctx context.Context, id ID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.add("complete %d", id)
}

func (r *recorder) NotifyAborted(ctx context.Context, id ID, reason error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.aborted[id] = reason
	r.add("abort %d", id)
}

func (r *recorder) FailJob(ctx context.Context, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = append(r.failed, err)
	r.add("fail")
}

func (r *recorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.log)
}

func (r *recorder) has(entry string) bool { return slices.Contains(r.snapshot(), entry) }

func (r *recorder) lastTrigger() ID {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.triggers) == 0 {
		return 0
	}
	return r.triggers[len(r.triggers)-1]
}

// waitFor polls cond; the generous bound only catches hangs, it asserts
// nothing about speed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func driverConfig() CoordinatorConfig {
	cfg := testConfig()
	cfg.Interval = time.Hour // tests trigger with TriggerNow
	cfg.Timeout = time.Hour
	return cfg
}

// startDriver runs d until the test ends and returns Run's result channel.
func startDriver(t *testing.T, d *Driver) (cancel func(), done <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	go func() { ch <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-d.done
	})
	return cancel, ch
}

func ackAll(t *testing.T, d *Driver, tasks []TaskID, id ID) {
	t.Helper()
	for _, task := range tasks {
		if err := d.Ack(context.Background(), task, id, snap(task, 4), time.Millisecond); err != nil {
			t.Fatalf("Ack(%s, %d): %v", task, id, err)
		}
	}
}

func TestDriverSavesBeforeNotifyingComplete(t *testing.T) {
	rec := newRecorder()
	cfg := driverConfig()
	d, err := NewDriver(cfg, rec, rec, WithTickInterval(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	startDriver(t, d)
	ctx := context.Background()
	for want := ID(1); want <= 3; want++ {
		if err := d.TriggerNow(ctx, "test"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, fmt.Sprintf("trigger %d", want), func() bool { return rec.lastTrigger() == want })
		ps, err := d.Pending(ctx)
		if err != nil || len(ps) != 1 || ps[0].ID != want || len(ps[0].Waiting) != len(cfg.Tasks) {
			t.Fatalf("Pending() = %+v, %v", ps, err)
		}
		ackAll(t, d, cfg.Tasks, want)
		waitFor(t, "complete", func() bool { return rec.has(fmt.Sprintf("complete %d", want)) })
	}
	want := []string{
		"id 1", "trigger 1", "save 1", "complete 1",
		"id 2", "trigger 2", "save 2", "complete 2",
		"id 3", "trigger 3", "save 3", "complete 3",
	}
	if got := rec.snapshot(); !slices.Equal(got, want) {
		t.Fatalf("calls = %v, want %v", got, want)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if c := rec.saved[2]; c.Job != cfg.Job || len(c.Tasks) != len(cfg.Tasks) || c.Stats["sink#0"].Alignment != time.Millisecond {
		t.Fatalf("saved %+v", c)
	}
}

func TestDriverFailpointAfterPersistStopsBeforeNotify(t *testing.T) {
	rec := newRecorder()
	cfg := driverConfig()
	boom := errors.New("failpoint fired")
	var names []string
	var mu sync.Mutex
	hook := func(name string) error {
		mu.Lock()
		defer mu.Unlock()
		names = append(names, name)
		return boom
	}
	d, err := NewDriver(cfg, rec, rec, WithFailpoint(hook))
	if err != nil {
		t.Fatal(err)
	}
	_, done := startDriver(t, d)
	ctx := context.Background()
	if err := d.TriggerNow(ctx, "test"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "trigger", func() bool { return rec.lastTrigger() == 1 })
	ackAll(t, d, cfg.Tasks, 1)
	if err := <-done; !errors.Is(err, boom) {
		t.Fatalf("Run = %v, want the failpoint's error", err)
	}
	if got, want := rec.snapshot(), []string{"id 1", "trigger 1", "save 1"}; !slices.Equal(got, want) {
		t.Fatalf("calls = %v, want %v (durable, never notified)", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(names, []string{FailpointAfterPersisted}) {
		t.Fatalf("failpoints hit = %v", names)
	}
	if err := d.Ack(ctx, "src#0", 1, TaskSnapshot{}, 0); !errors.Is(err, ErrDriverStopped) {
		t.Fatalf("Ack after stop = %v, want ErrDriverStopped", err)
	}
}

func TestDriverAbortsOnTimeoutDeclineAndFailures(t *testing.T) {
	diskErr := errors.New("disk full")
	tests := []struct {
		name      string
		setup     func(r *recorder, cfg *CoordinatorConfig)
		act       func(t *testing.T, d *Driver, id ID)
		wantAbort error
	}{
		{
			name:      "timeout",
			setup:     func(r *recorder, cfg *CoordinatorConfig) { cfg.Timeout = 20 * time.Millisecond },
			act:       func(t *testing.T, d *Driver, id ID) {},
			wantAbort: ErrTimeout,
		},
		{
			name:  "decline",
			setup: func(r *recorder, cfg *CoordinatorConfig) {},
			act: func(t *testing.T, d *Driver, id ID) {
				if err := d.Decline(context.Background(), "sink#0", id, diskErr); err != nil {
					t.Fatal(err)
				}
			},
			wantAbort: ErrDeclined,
		},
		{
			name:      "save error",
			setup:     func(r *recorder, cfg *CoordinatorConfig) { r.saveErr = diskErr },
			act:       func(t *testing.T, d *Driver, id ID) { ackAll(t, d, driverConfig().Tasks, id) },
			wantAbort: ErrPersistFailed,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := newRecorder()
			cfg := driverConfig()
			cfg.TolerableFailures = -1
			tt.setup(rec, &cfg)
			d, err := NewDriver(cfg, rec, rec, WithTickInterval(time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			startDriver(t, d)
			if err := d.TriggerNow(context.Background(), "test"); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "trigger", func() bool { return rec.lastTrigger() == 1 })
			tt.act(t, d, 1)
			waitFor(t, "FailJob", func() bool { return rec.has("fail") })
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if !errors.Is(rec.aborted[1], tt.wantAbort) {
				t.Fatalf("abort reason %v, want %v", rec.aborted[1], tt.wantAbort)
			}
			if len(rec.failed) != 1 || !errors.Is(rec.failed[0], ErrTooManyFailures) {
				t.Fatalf("FailJob errors %v", rec.failed)
			}
			if slices.Contains(rec.log, "complete 1") {
				t.Fatal("failed checkpoint notified complete")
			}
		})
	}
}

func TestDriverTriggersPeriodically(t *testing.T) {
	rec := newRecorder()
	cfg := driverConfig()
	cfg.Interval = 5 * time.Millisecond
	cfg.MaxConcurrent = 2
	d, err := NewDriver(cfg, rec, rec)
	if err != nil {
		t.Fatal(err)
	}
	startDriver(t, d)
	waitFor(t, "two triggers", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.triggers) >= 2
	})
	// Max concurrent 2 and nobody acks: no third trigger until one ends.
	ps, err := d.Pending(context.Background())
	if err != nil || len(ps) != 2 {
		t.Fatalf("Pending() = %+v, %v", ps, err)
	}
	ackAll(t, d, cfg.Tasks, 2) // completes 2, subsumes 1
	// Both slots are free again: the fourth trigger follows the third within
	// an interval (5 ms), so a poll that comes later than that sees 4.
	waitFor(t, "third trigger", func() bool { return rec.lastTrigger() >= 3 })
	if !rec.has("abort 1") || !rec.has("complete 2") {
		t.Fatalf("calls %v", rec.snapshot())
	}
}

func TestDriverTaskFailedAndRestored(t *testing.T) {
	rec := newRecorder()
	cfg := driverConfig()
	d, err := NewDriver(cfg, rec, rec)
	if err != nil {
		t.Fatal(err)
	}
	startDriver(t, d)
	ctx := context.Background()
	if err := d.TriggerNow(ctx, "test"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "trigger", func() bool { return rec.lastTrigger() == 1 })
	crash := errors.New("task lost")
	if err := d.TaskFailed(ctx, crash); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "abort", func() bool { return rec.has("abort 1") })
	if err := d.TriggerNow(ctx, "ignored while restarting"); err != nil {
		t.Fatal(err)
	}
	if ps, err := d.Pending(ctx); err != nil || len(ps) != 0 {
		t.Fatalf("Pending() = %+v, %v", ps, err)
	}
	if err := d.Restored(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := d.TriggerNow(ctx, "after restore"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "trigger after restore", func() bool { return rec.lastTrigger() == 2 })
	want := []string{"id 1", "trigger 1", "abort 1", "id 2", "trigger 2"}
	if got := rec.snapshot(); !slices.Equal(got, want) {
		t.Fatalf("calls = %v, want %v", got, want)
	}
}

func TestDriverStopsOnContextCancel(t *testing.T) {
	rec := newRecorder()
	d, err := NewDriver(driverConfig(), rec, rec)
	if err != nil {
		t.Fatal(err)
	}
	cancel, done := startDriver(t, d)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	ctx := context.Background()
	if err := d.Run(ctx); !errors.Is(err, ErrDriverRunning) {
		t.Fatalf("second Run = %v, want ErrDriverRunning", err)
	}
	if err := d.TriggerNow(ctx, "late"); !errors.Is(err, ErrDriverStopped) {
		t.Fatalf("TriggerNow = %v, want ErrDriverStopped", err)
	}
	if _, err := d.Pending(ctx); !errors.Is(err, ErrDriverStopped) {
		t.Fatalf("Pending = %v, want ErrDriverStopped", err)
	}
}

func TestNewDriverRejectsInvalidArguments(t *testing.T) {
	rec := newRecorder()
	bad := driverConfig()
	bad.Tasks = nil
	tests := []struct {
		name string
		cfg  CoordinatorConfig
		exec Executor
		pers Persister
	}{
		{"nil executor", driverConfig(), nil, rec},
		{"nil persister", driverConfig(), rec, nil},
		{"bad config", bad, rec, rec},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewDriver(tt.cfg, tt.exec, tt.pers); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("err = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

// TestDriverWithStoreIDsIncreaseAcrossRestarts runs two drivers, one after
// the other as a job manager failover would, over the real pebble Store.
func TestDriverWithStoreIDsIncreaseAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	cfg := driverConfig()
	ctx := context.Background()
	var lastID ID
	for round := range 2 {
		store := mustOpen(t, dir)
		rec := newRecorder()
		d, err := NewDriver(cfg, rec, store)
		if err != nil {
			t.Fatal(err)
		}
		cancel, done := startDriver(t, d)
		if round > 0 {
			latest, err := store.Latest(ctx, cfg.Job)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Restored(ctx, latest.ID); err != nil {
				t.Fatal(err)
			}
		}
		// One checkpoint completes, the next one is left in flight.
		for i := range 2 {
			if err := d.TriggerNow(ctx, "test"); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "trigger", func() bool { return rec.lastTrigger() > lastID })
			id := rec.lastTrigger()
			if id <= lastID {
				t.Fatalf("round %d: id %d after %d", round, id, lastID)
			}
			lastID = id
			if i == 0 {
				ackAll(t, d, cfg.Tasks, id)
				waitFor(t, "complete", func() bool { return rec.has(fmt.Sprintf("complete %d", id)) })
				latest, err := store.Latest(ctx, cfg.Job)
				if err != nil || latest.ID != id || len(latest.Tasks) != len(cfg.Tasks) {
					t.Fatalf("Latest = %d (%d tasks), %v; want %d", latest.ID, len(latest.Tasks), err, id)
				}
			}
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		mustClose(t, store)
	}
}

func TestDriverFailsJobWhenTriggerOrIDFails(t *testing.T) {
	rpcErr := errors.New("unreachable")
	tests := []struct {
		name      string
		setup     func(r *recorder)
		want      error
		wantAbort bool
	}{
		{"trigger error", func(r *recorder) { r.trigErr = rpcErr }, ErrTriggerFailed, true},
		{"id error", func(r *recorder) { r.idErr = rpcErr }, ErrIDUnavailable, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := newRecorder()
			tt.setup(rec)
			cfg := driverConfig()
			cfg.TolerableFailures = -1
			d, err := NewDriver(cfg, rec, rec)
			if err != nil {
				t.Fatal(err)
			}
			startDriver(t, d)
			if err := d.TriggerNow(context.Background(), "test"); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "FailJob", func() bool { return rec.has("fail") })
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if len(rec.failed) != 1 || !errors.Is(rec.failed[0], tt.want) || !errors.Is(rec.failed[0], rpcErr) {
				t.Fatalf("FailJob errors %v, want %v", rec.failed, tt.want)
			}
			if _, aborted := rec.aborted[1]; aborted != tt.wantAbort {
				t.Fatalf("checkpoint 1 aborted: %v, want %v", aborted, tt.wantAbort)
			}
		})
	}
}

func TestDriverSavepointReturnsTheCheckpointOnceSavedAndNotified(t *testing.T) {
	rec := newRecorder()
	cfg := driverConfig()
	d, err := NewDriver(cfg, rec, rec, WithTickInterval(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	startDriver(t, d)
	ctx := t.Context()
	type result struct {
		c   Completed
		err error
	}
	got := make(chan result, 1)
	go func() {
		c, err := d.TriggerSavepoint(ctx, false, false)
		got <- result{c, err}
	}()
	waitFor(t, "trigger 1", func() bool { return rec.lastTrigger() == 1 })
	ackAll(t, d, cfg.Tasks, 1)
	r := <-got
	if r.err != nil || r.c.ID != 1 || len(r.c.Tasks) != len(cfg.Tasks) {
		t.Fatalf("TriggerSavepoint = %d (%d tasks), %v; want checkpoint 1 of every task", r.c.ID, len(r.c.Tasks), r.err)
	}
	if calls := rec.snapshot(); !slices.Equal(calls, []string{"id 1", "trigger 1", "save 1", "complete 1"}) {
		t.Fatalf("calls = %v: the savepoint must be answered after its save and its notification", calls)
	}

	// A declined savepoint fails with its abort's reason.
	go func() {
		c, err := d.TriggerSavepoint(ctx, true, false)
		got <- result{c, err}
	}()
	waitFor(t, "trigger 2", func() bool { return rec.lastTrigger() == 2 })
	if err := d.Decline(ctx, cfg.Tasks[0], 2, errors.New("no")); err != nil {
		t.Fatal(err)
	}
	if r := <-got; !errors.Is(r.err, ErrDeclined) {
		t.Fatalf("declined savepoint: %v, want ErrDeclined", r.err)
	}
}

func TestDriverSavepointFailsWhenTheDriverStops(t *testing.T) {
	rec := newRecorder()
	d, err := NewDriver(driverConfig(), rec, rec, WithTickInterval(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	cancel, done := startDriver(t, d)
	errc := make(chan error, 1)
	go func() {
		_, err := d.TriggerSavepoint(t.Context(), false, false)
		errc <- err
	}()
	waitFor(t, "trigger 1", func() bool { return rec.lastTrigger() == 1 })
	cancel()
	<-done
	if err := <-errc; !errors.Is(err, ErrDriverStopped) {
		t.Fatalf("TriggerSavepoint after the driver stopped: %v, want ErrDriverStopped", err)
	}
}
