package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/jobmanager"
	"github.com/weirstream/weir/taskmanager"
)

// recovery: how long the exactly-once wordcount's output stops when a task
// manager is SIGKILLed (and started again at once, as a supervisor would),
// against a clean task failure (the failpoint task.process=error@N: the
// task fails, its task manager lives on) as the baseline, on one cluster
// in the same run: an in-process broker and job manager and two task
// managers of one slot each (processes of streamctl under `streamctl
// bench`: Config.TaskManager), the job at parallelism 2 with the default
// restart strategy, input arriving throughout. Each fault hits a job of
// its own, at its first failure: the default strategy's delay grows with
// every failure of a job within an hour, and a second failure would be
// measured against a longer delay than the first.
//
// Each is measured from the fault (the kill; the failure as the job
// manager learned of it: the task's report) to output resuming: the first
// committed output record (read_committed) that counts a line produced
// after the fault. Each line carries a token of its own ("l<N>"), whose
// count the job emits, so a commit of output from before the fault never
// counts as resuming. The job manager's timing of the restart
// (jobmanager.Recovery) splits that time into its steps, reported in the
// note as medians over the runs. After each run the output is checked
// record by record (every word counted 1..n).

// TaskManager is a task manager the recovery benchmark started.
type TaskManager struct {
	// Kill ends it at once, without any cleanup (SIGKILL for a process),
	// and returns once it is gone.
	Kill func()
	// Stop stops it cleanly and returns once it is gone.
	Stop func()
}

// StartTaskManager starts one task manager with the given id, registered
// with the job manager at jmAddr, offering one slot and registering
// JobTypes, with the failpoints spec (WEIR_FAILPOINTS syntax; "" for none).
type StartTaskManager func(ctx context.Context, jmAddr, id, failpoints string) (TaskManager, error)

// inProcessTaskManager is the StartTaskManager of tests: a task manager in
// this process. Its Kill cancels it, which is not a SIGKILL: the process
// benchmark is streamctl's.
func inProcessTaskManager(ctx context.Context, jmAddr, id, failpoints string) (TaskManager, error) {
	reg, err := Registry()
	if err != nil {
		return TaskManager{}, err
	}
	fp, err := failpoint.Parse(failpoints)
	if err != nil {
		return TaskManager{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = taskmanager.Run(ctx, jmAddr, taskmanager.ID(id), taskmanager.Slots(1), taskmanager.Jobs(reg), taskmanager.Failpoints(fp))
	}()
	end := func() { cancel(); <-done }
	return TaskManager{Kill: end, Stop: end}, nil
}

// recoveryFailAt is the task.process hit at which the clean failure comes:
// a few seconds into the run at recoveryRate (each line is processed by
// three operators, each word by two).
const recoveryFailAt = 4000

// recoveryRate is the input rate: lines per recoveryTick.
const (
	recoveryLines = 20
	recoveryTick  = 50 * time.Millisecond
)

// recovered is one fault's measure: from the fault to output resuming,
// and the job manager's timing of the restart.
type recovered struct {
	took time.Duration
	// fault is when the fault hit (the kill; the job manager's learning
	// of the clean failure), resumed when output resumed.
	fault, resumed time.Time
	rec            jobmanager.Recovery
}

// Recovery measures seconds from a task-manager SIGKILL to output
// resuming, against a clean task failure (3 runs, 1 with Quick).
func Recovery(ctx context.Context, cfg Config) ([]Line, error) {
	runs := cfg.runsOf(3, 1)
	kb, err := startBroker(ctx)
	if err != nil {
		return nil, err
	}
	defer kb.Close()
	jm, err := startJobManager(ctx)
	if err != nil {
		return nil, err
	}
	defer jm.Close()
	start := cfg.TaskManager
	where := "task-manager processes (SIGKILL)"
	if start == nil {
		start, where = inProcessTaskManager, "in-process task managers (cancelled, not SIGKILLed)"
	}
	var kills, cleans []recovered
	for i := range runs {
		cfg.progress("run %d/%d", i+1, runs)
		k, c, err := recoveryRun(ctx, kb, jm, start, i)
		if err != nil {
			return nil, fmt.Errorf("run %d: %w", i+1, err)
		}
		kills, cleans = append(kills, k), append(cleans, c)
	}
	l := compared("recovery", "seconds_to_resume", "clean-task-failure", seconds(kills), seconds(cleans))
	l.Note = fmt.Sprintf("from a task-manager kill (restarted at once) and from a clean task failure (failpoint %s=error@%d, from the "+
		"job manager's receipt of the report) to the first committed output of input written after the fault; each fault on a job of its own "+
		"at its first failure; exactly-once wordcount, parallelism 2, checkpoints every 200 ms, default restart strategy (first delay 1 s, "+
		"counted from the failure), %d lines/s; 2 %s of 1 slot; median of %d runs; kill %s s; clean failure %s s; "+
		"kill's steps (medians): %s; clean failure's steps (medians): %s; each kill: %s",
		failpoint.TaskProcess, recoveryFailAt, int(recoveryLines*time.Second/recoveryTick), where, runs,
		secs(seconds(kills)), secs(seconds(cleans)), steps(kills, true), steps(cleans, false), eachRun(kills))
	return []Line{l}, nil
}

// secs formats seconds in run order with two decimals.
func secs(vs []float64) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strings.Join(parts, ", ")
}

// seconds are the measures' times in seconds, in run order.
func seconds(rs []recovered) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = r.took.Seconds()
	}
	return out
}

// steps describes the median of each step over rs: for a kill, first the
// detection (from the kill to the job manager learning of it, and how),
// then the job manager's steps (jobmanager.Recovery.Steps), then "commit
// and read" (from the checkpoint that ended the recovery to the output
// seen read_committed: the sinks' commit on its notification, the reader's
// fetch).
func steps(rs []recovered, kill bool) string {
	var names []string
	took := map[string][]float64{}
	add := func(name string, d time.Duration) {
		if _, ok := took[name]; !ok {
			names = append(names, name)
		}
		took[name] = append(took[name], d.Seconds())
	}
	detected := map[string]int{}
	for _, r := range rs {
		if kill {
			add("detection", r.rec.Failed.Sub(r.fault))
		}
		detected[string(r.rec.Detection)]++
		for _, s := range r.rec.Steps() {
			add(s.Name, s.Took)
		}
		if r.rec.Done() {
			add("commit and read", r.resumed.Sub(r.rec.Checkpoint))
		}
	}
	parts := make([]string, 0, len(names)+1)
	how := make([]string, 0, len(detected))
	for d, n := range detected {
		how = append(how, fmt.Sprintf("%s %d/%d", d, n, len(rs)))
	}
	slices.Sort(how)
	parts = append(parts, "detected by "+strings.Join(how, ", "))
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %.2f", n, median(took[n])))
	}
	return strings.Join(parts, ", ") + " s"
}

// eachRun describes each measure of rs in run order, its time split into
// the fault's detection, the restart (the longer of the cancel and the
// restart delay), the new attempt's deployment (slots, deploy, restore),
// the sources' re-open, the first checkpoint, and the commit and read.
func eachRun(rs []recovered) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		rec, ms := r.rec, func(from, to time.Time) int64 { return to.Sub(from).Milliseconds() }
		if !rec.Done() {
			parts[i] = fmt.Sprintf("%.2f s (the restart's timing incomplete: %s)", r.took.Seconds(), rec)
			continue
		}
		parts[i] = fmt.Sprintf("%.2f s = detection %d + restart %d + deployment %d + source re-open %d + first checkpoint %d + commit and read %d ms",
			r.took.Seconds(), ms(r.fault, rec.Failed), ms(rec.Failed, rec.Restarted), ms(rec.Restarted, rec.Opened),
			ms(rec.Opened, rec.FirstRecord), ms(rec.FirstRecord, rec.Checkpoint), ms(rec.Checkpoint, r.resumed))
	}
	return strings.Join(parts, "; ")
}

// recoveryRun runs two jobs, each on topics of its own: the clean failure
// comes at the failpoint of task manager b in the first; then task manager
// a is killed under the second and started again.
func recoveryRun(ctx context.Context, kb *kafkaBroker, jm *localJobManager, start StartTaskManager, run int) (kill, clean recovered, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	a, err := start(ctx, jm.addr, fmt.Sprintf("recovery-a-%d", run), "")
	if err != nil {
		return kill, clean, fmt.Errorf("start task manager: %w", err)
	}
	defer func() { a.Stop() }()
	b, err := start(ctx, jm.addr, fmt.Sprintf("recovery-b-%d", run),
		fmt.Sprintf("%s=error@%d", failpoint.TaskProcess, recoveryFailAt))
	if err != nil {
		return kill, clean, fmt.Errorf("start task manager: %w", err)
	}
	defer b.Stop()

	// The clean failure: the job manager times the restart from the
	// failure's report.
	clean, err = recoveryJob(ctx, kb, jm, fmt.Sprintf("recovery-clean-%d", run), func(id string) (time.Time, error) {
		for {
			if rs := jm.srv.Recoveries(id); len(rs) > 0 {
				return rs[0].Failed, nil
			}
			r, _, err := jm.srv.Job(ctx, id)
			if err != nil {
				return time.Time{}, err
			}
			if r.State == jobmanager.StateFailed || r.State == jobmanager.StateCanceled || r.State == jobmanager.StateFinished {
				return time.Time{}, fmt.Errorf("job %s ended (%s) before the failpoint fired: %s", id, r.State, r.Error)
			}
			if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
				return time.Time{}, fmt.Errorf("the failpoint did not fire: %w", err)
			}
		}
	})
	if err != nil {
		return kill, clean, fmt.Errorf("clean failure: %w", err)
	}
	// The kill, once output has flowed steadily for a moment.
	kill, err = recoveryJob(ctx, kb, jm, fmt.Sprintf("recovery-kill-%d", run), func(string) (time.Time, error) {
		if err := sleepCtx(ctx, 2*time.Second); err != nil {
			return time.Time{}, err
		}
		killed := time.Now()
		a.Kill()
		if a, err = start(ctx, jm.addr, fmt.Sprintf("recovery-a-%d", run), ""); err != nil {
			return time.Time{}, fmt.Errorf("restart task manager: %w", err)
		}
		return killed, nil
	})
	if err != nil {
		return kill, clean, fmt.Errorf("kill: %w", err)
	}
	return kill, clean, nil
}

// recoveryJob runs the wordcount on topics named after name, fed
// throughout; once its output flows, fault injects the fault (or waits
// for it) and returns when it hit. It returns the measure, once the job
// manager's timing of the restart is complete, after checking the output
// record by record, and cancels the job.
func recoveryJob(ctx context.Context, kb *kafkaBroker, jm *localJobManager, name string, fault func(id string) (time.Time, error)) (recovered, error) {
	var r recovered
	in, out := name+"-in", name+"-out"
	if _, err := kb.adm.CreateTopic(ctx, 4, -1, nil, in); err != nil {
		return r, err
	}
	if err := waitSlots(ctx, jm.srv, 2); err != nil {
		return r, err
	}
	feed, err := startFeed(ctx, kb.addr, in)
	if err != nil {
		return r, err
	}
	defer func() { _, _ = feed.stop() }()
	mon, err := watchOutput(ctx, kb.addr, out)
	if err != nil {
		return r, err
	}
	defer mon.stop()
	// A task manager of the previous run may still count as registered
	// until its goodbye arrives: the slots waited for can be its, so a
	// refusal for slots is retried while the new ones register.
	var id string
	for deadline := time.Now().Add(30 * time.Second); ; {
		id, err = jm.srv.Submit(ctx, wordcount.Type.Name, map[string]string{"brokers": kb.addr, "input": in, "output": out,
			"group": name, "parallelism": "2"}, 200*time.Millisecond, "")
		if err == nil {
			break
		}
		if !errors.Is(err, jobmanager.ErrNotEnoughSlots) || time.Now().After(deadline) {
			return r, err
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return r, err
		}
	}
	defer func() { _, _ = jm.srv.Cancel(context.WithoutCancel(ctx), id) }()
	if _, err := mon.resumedAfter(ctx, feed.after(time.Now())); err != nil {
		return r, fmt.Errorf("before the fault: %w", err)
	}
	if r.fault, err = fault(id); err != nil {
		return r, err
	}
	if r.resumed, err = mon.resumedAfter(ctx, feed.after(r.fault)); err != nil {
		return r, fmt.Errorf("after the fault: %w", err)
	}
	r.took = r.resumed.Sub(r.fault)
	// The restart's last steps reach the job manager with the task
	// managers' heartbeats (every 500 ms).
	for deadline := time.Now().Add(10 * time.Second); ; {
		rs := jm.srv.Recoveries(id)
		if len(rs) > 0 {
			r.rec = rs[len(rs)-1]
		}
		if r.rec.Done() || time.Now().After(deadline) {
			break
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return r, err
		}
	}
	// Every word of every line fed counted 1..n, once.
	lines, err := feed.stop()
	if err != nil {
		return r, err
	}
	want := wordcount.Expected(lines)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		rep, err := wordcount.Verify(ctx, []string{kb.addr}, out, want)
		if err == nil && rep.OK() {
			return r, nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return r, fmt.Errorf("verify %s: %w", out, err)
			}
			return r, fmt.Errorf("output %s after the fault: %s", out, rep)
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return r, err
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// feed produces numbered lines to a topic, recoveryLines every
// recoveryTick, until stopped. A line counts as fed once its produce was
// acknowledged.
type feed struct {
	quit chan struct{}
	done chan struct{}

	mu    sync.Mutex
	lines []string
	at    []time.Time // when line i was handed to the producer
	err   error
}

func startFeed(ctx context.Context, addr, topic string) (*feed, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic))
	if err != nil {
		return nil, err
	}
	f := &feed{quit: make(chan struct{}), done: make(chan struct{})}
	corpus := Corpus(5, 1000, 4, 500)
	go func() {
		defer close(f.done)
		defer cl.Close()
		t := time.NewTicker(recoveryTick)
		defer t.Stop()
		for n := 0; ; {
			select {
			case <-f.quit:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			recs := make([]*kgo.Record, recoveryLines)
			lines := make([]string, recoveryLines)
			now := time.Now()
			for k := range recs {
				lines[k] = fmt.Sprintf("%s l%d", corpus[n%len(corpus)], n)
				recs[k] = kgo.StringRecord(lines[k])
				n++
			}
			// Not cut short by stop: a line half produced would be
			// counted as lost.
			err := cl.ProduceSync(ctx, recs...).FirstErr()
			f.mu.Lock()
			if err != nil {
				f.err = fmt.Errorf("feed: %w", err)
				f.mu.Unlock()
				return
			}
			f.lines = append(f.lines, lines...)
			for range lines {
				f.at = append(f.at, now)
			}
			f.mu.Unlock()
		}
	}()
	return f, nil
}

// after returns the number of the first line produced after t.
func (f *feed) after(t time.Time) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, at := range f.at {
		if at.After(t) {
			return i
		}
	}
	return len(f.at)
}

// stop stops the feed (idempotent) and returns the lines it produced, or
// why it stopped early.
func (f *feed) stop() ([]string, error) {
	select {
	case <-f.quit:
	default:
		close(f.quit)
	}
	<-f.done
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lines, f.err
}

// outputWatch reads an output topic read_committed and notes when the
// count of each line's own token ("l<N>") first arrived.
type outputWatch struct {
	cl   *kgo.Client
	done chan struct{}

	mu   sync.Mutex
	seen map[int]time.Time
	cond chan struct{} // closed and replaced when seen grows
}

func watchOutput(ctx context.Context, addr, topic string) (*outputWatch, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.MetadataMinAge(100*time.Millisecond), kgo.MetadataMaxAge(time.Second))
	if err != nil {
		return nil, err
	}
	w := &outputWatch{cl: cl, done: make(chan struct{}), seen: map[int]time.Time{}, cond: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			fs := cl.PollFetches(ctx)
			if fs.IsClientClosed() || ctx.Err() != nil {
				return
			}
			now := time.Now()
			w.mu.Lock()
			grew := false
			fs.EachRecord(func(r *kgo.Record) {
				k := string(r.Key)
				if !strings.HasPrefix(k, "l") {
					return
				}
				if n, err := strconv.Atoi(k[1:]); err == nil {
					if _, ok := w.seen[n]; !ok {
						w.seen[n], grew = now, true
					}
				}
			})
			if grew {
				close(w.cond)
				w.cond = make(chan struct{})
			}
			w.mu.Unlock()
		}
	}()
	return w, nil
}

// errNoResume is returned when output does not resume within two minutes.
var errNoResume = errors.New("no output of new input within 2 minutes")

// resumedAfter waits until the output counts a line numbered from on, and
// returns when the first such count arrived.
func (w *outputWatch) resumedAfter(ctx context.Context, from int) (time.Time, error) {
	deadline := time.After(2 * time.Minute)
	for {
		w.mu.Lock()
		var first time.Time
		for n, at := range w.seen {
			if n >= from && (first.IsZero() || at.Before(first)) {
				first = at
			}
		}
		cond := w.cond
		w.mu.Unlock()
		if !first.IsZero() {
			return first, nil
		}
		select {
		case <-cond:
		case <-deadline:
			return time.Time{}, errNoResume
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
}

func (w *outputWatch) stop() {
	w.cl.Close()
	<-w.done
}
