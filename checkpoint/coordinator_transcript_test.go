package checkpoint

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestCoordinatorTranscripts replays the transcripts in testdata/coordinator:
// events in, actions out, as pebble's datadriven tests do. Each file is one
// or more scenarios; the commands are:
//
//	new interval=10s timeout=30s [min-pause=none|5s] [max-concurrent=n] [tolerable=n]
//	    tasks=a,b,... sources=a,...      a fresh coordinator
//	tick t=12s                           Tick at t0+12s
//	trigger-now t=1s [reason=r]          TriggerNow
//	id t=1s (id=n | err=text)            IDAssigned
//	trigger-failed t=1s id=n err=text    TriggerFailed
//	ack t=1s id=n task=a[,b...]          one Ack per task, in order
//	decline t=1s id=n task=a err=text    Decline
//	persisted t=1s id=n [err=text]       Persisted (err=outcome-unknown wraps ErrOutcomeUnknown)
//	task-failed t=1s err=text            TaskFailed
//	restored t=1s last=n                 Restored
//	savepoint t=1s [stop]                TriggerSavepoint
//	resume-triggers t=1s                 ResumeTriggers
//	pending                              Pending(), LastCompleted, failures
//
// Every event prints the actions it produced, one per line ("-" for none).
// Rewrite the expectations with -rewrite after a deliberate change.
func TestCoordinatorTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata/coordinator", func(t *testing.T, path string) {
		var c *Coordinator
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd == "new" {
				cfg, err := transcriptConfig(t, d)
				if err != nil {
					return err.Error()
				}
				if c, err = NewCoordinator(cfg); err != nil {
					return err.Error()
				}
				return "ok"
			}
			if c == nil {
				d.Fatalf(t, "%s before new", d.Cmd)
			}
			if d.Cmd == "pending" {
				return formatPending(c)
			}
			var acts []Action
			for _, ev := range transcriptEvents(t, d) {
				acts = append(acts, c.Step(ev)...)
			}
			return formatActions(acts)
		})
	})
}

func transcriptConfig(t *testing.T, d *datadriven.TestData) (CoordinatorConfig, error) {
	cfg := CoordinatorConfig{Job: "job-1"}
	for _, arg := range d.CmdArgs {
		switch arg.Key {
		case "interval":
			cfg.Interval = transcriptDuration(t, d, arg.Vals[0])
		case "timeout":
			cfg.Timeout = transcriptDuration(t, d, arg.Vals[0])
		case "min-pause":
			if arg.Vals[0] == "none" {
				cfg.MinPause = NoMinPause
			} else {
				cfg.MinPause = transcriptDuration(t, d, arg.Vals[0])
			}
		case "max-concurrent":
			d.ScanArgs(t, "max-concurrent", &cfg.MaxConcurrent)
		case "tolerable":
			d.ScanArgs(t, "tolerable", &cfg.TolerableFailures)
		case "tasks":
			cfg.Tasks = transcriptTasks(arg.Vals)
		case "sources":
			cfg.Sources = transcriptTasks(arg.Vals)
		default:
			return cfg, fmt.Errorf("unknown argument %q", arg.Key)
		}
	}
	return cfg, nil
}

// transcriptEvents builds the events of one command.
func transcriptEvents(t *testing.T, d *datadriven.TestData) []Event {
	var at string
	d.ScanArgs(t, "t", &at)
	now := t0.Add(transcriptDuration(t, d, at))
	id := func() ID {
		var n uint64
		d.ScanArgs(t, "id", &n)
		return ID(n)
	}
	errArg := func() error {
		if !d.HasArg("err") {
			return nil
		}
		var s string
		d.ScanArgs(t, "err", &s)
		if s == "outcome-unknown" {
			return fmt.Errorf("store: %w", ErrOutcomeUnknown)
		}
		return errors.New(s)
	}
	switch d.Cmd {
	case "tick":
		return []Event{Tick{Now: now}}
	case "trigger-now":
		reason := "test"
		d.MaybeScanArgs(t, "reason", &reason)
		return []Event{TriggerNow{Now: now, Reason: reason}}
	case "id":
		if err := errArg(); err != nil {
			return []Event{IDAssigned{Err: err, Now: now}}
		}
		return []Event{IDAssigned{ID: id(), Now: now}}
	case "trigger-failed":
		return []Event{TriggerFailed{ID: id(), Err: errArg(), Now: now}}
	case "ack":
		var evs []Event
		for _, task := range transcriptTasks(argVals(d, "task")) {
			evs = append(evs, Ack{Task: task, ID: id(), Snapshot: snap(task, 10), Now: now})
		}
		return evs
	case "decline":
		var task string
		d.ScanArgs(t, "task", &task)
		return []Event{Decline{Task: TaskID(task), ID: id(), Err: errArg(), Now: now}}
	case "persisted":
		return []Event{Persisted{ID: id(), Err: errArg(), Now: now}}
	case "task-failed":
		return []Event{TaskFailed{Err: errArg(), Now: now}}
	case "savepoint":
		return []Event{TriggerSavepoint{Now: now, Stop: d.HasArg("stop"), Drain: d.HasArg("drain")}}
	case "resume-triggers":
		return []Event{ResumeTriggers{Now: now}}
	case "restored":
		var last uint64
		d.ScanArgs(t, "last", &last)
		return []Event{Restored{LastCompleted: ID(last), Now: now}}
	}
	d.Fatalf(t, "unknown command %q", d.Cmd)
	return nil
}

func argVals(d *datadriven.TestData, key string) []string {
	for _, a := range d.CmdArgs {
		if a.Key == key {
			return a.Vals
		}
	}
	return nil
}

// transcriptTasks reads task lists written a,b,c (or (a,b,c)).
func transcriptTasks(vals []string) []TaskID {
	var ts []TaskID
	for _, v := range vals {
		for _, s := range strings.Split(v, ",") {
			ts = append(ts, TaskID(s))
		}
	}
	return ts
}

func transcriptDuration(t *testing.T, d *datadriven.TestData, s string) time.Duration {
	dur, err := time.ParseDuration(s)
	if err != nil {
		d.Fatalf(t, "duration %q: %v", s, err)
	}
	return dur
}

// formatActions prints actions one per line, times relative to t0.
func formatActions(acts []Action) string {
	if len(acts) == 0 {
		return "-"
	}
	var b strings.Builder
	for _, a := range acts {
		switch a := a.(type) {
		case RequestID:
			fmt.Fprintf(&b, "request-id reason=%s\n", a.Reason)
		case Trigger:
			fmt.Fprintf(&b, "trigger id=%d sources=%s at=%s reason=%s%s\n", a.ID, joinTasks(a.Sources), a.At.Sub(t0), a.Reason, savepointFlags(a.Savepoint, a.Stop, a.Drain))
		case Persist:
			tasks := make([]TaskID, 0, len(a.Completed.Tasks))
			for task := range a.Completed.Tasks {
				tasks = append(tasks, task)
			}
			slices.Sort(tasks)
			fmt.Fprintf(&b, "persist id=%d triggered=%s completed=%s tasks=%s%s\n", a.Completed.ID,
				a.Completed.TriggeredAt.Sub(t0), a.Completed.CompletedAt.Sub(t0), joinTasks(tasks), savepointFlags(a.Savepoint, false, false))
		case NotifyComplete:
			fmt.Fprintf(&b, "notify-complete id=%d\n", a.ID)
		case NotifyAborted:
			fmt.Fprintf(&b, "notify-aborted id=%d reason=%q%s\n", a.ID, a.Reason, sentinels(a.Reason))
		case FailJob:
			fmt.Fprintf(&b, "fail-job err=%q%s\n", a.Err, sentinels(a.Err))
		case SavepointFailed:
			fmt.Fprintf(&b, "savepoint-failed err=%q%s\n", a.Err, sentinels(a.Err))
		default:
			fmt.Fprintf(&b, "unknown action %#v\n", a)
		}
	}
	return b.String()
}

// savepointFlags prints the savepoint marks of a Trigger or a Persist.
func savepointFlags(savepoint, stop, drain bool) string {
	switch {
	case drain:
		return " savepoint stop drain"
	case stop:
		return " savepoint stop"
	case savepoint:
		return " savepoint"
	}
	return ""
}

// sentinels names the package's errors that err wraps, so transcripts show
// what callers match with errors.Is, not only the text.
func sentinels(err error) string {
	var is []string
	for _, s := range []struct {
		name string
		err  error
	}{
		{"declined", ErrDeclined}, {"timeout", ErrTimeout}, {"subsumed", ErrSubsumed},
		{"failover", ErrJobFailover}, {"persist-failed", ErrPersistFailed},
		{"trigger-failed", ErrTriggerFailed}, {"id-unavailable", ErrIDUnavailable},
		{"id-not-increasing", ErrIDNotIncreasing}, {"too-many-failures", ErrTooManyFailures},
		{"outcome-unknown", ErrOutcomeUnknown},
	} {
		if errors.Is(err, s.err) {
			is = append(is, s.name)
		}
	}
	if len(is) == 0 {
		return ""
	}
	return " is=" + strings.Join(is, ",")
}

func formatPending(c *Coordinator) string {
	var b strings.Builder
	fmt.Fprintf(&b, "last-completed=%d failures=%d\n", c.LastCompleted(), c.ConsecutiveFailures())
	for _, p := range c.Pending() {
		fmt.Fprintf(&b, "pending id=%d phase=%s triggered=%s deadline=%s acked=%s waiting=%s\n", p.ID, p.Phase,
			p.TriggeredAt.Sub(t0), p.Deadline.Sub(t0), joinTasks(p.Acked), joinTasks(p.Waiting))
	}
	return b.String()
}

func joinTasks(ts []TaskID) string {
	if len(ts) == 0 {
		return "[]"
	}
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = string(t)
	}
	return strings.Join(s, ",")
}
