package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/runtime"
)

// The client commands: submit, list, status, cancel, checkpoints. Each
// dials the job manager (--jobmanager, default $WEIR_JOBMANAGER or
// 127.0.0.1:6123) and makes one call (submit --wait follows the job).

// callTimeout bounds one call to the job manager.
const callTimeout = 30 * time.Second

// ErrJobManager is wrapped by a client command's error when the job manager
// cannot be reached or refused the call.
var ErrJobManager = errors.New("job manager")

// client is a connection to the job manager at addr.
type client struct {
	addr     string
	tls      bool // the connection uses TLS
	jm       weirpb.JobManagerClient
	cc       interface{ Close() error }
	opts     []rpc.DialOpt
	followed bool // a standby's refusal was followed to the leader once
}

// dialJobManager connects to the job manager at addr, or to the leader
// among several (comma-separated: the job managers of a highly available
// cluster), which it asks who leads.
func dialJobManager(addr string, access *accessFlags) (*client, error) {
	opts, err := access.dialOpts()
	if err != nil {
		return nil, err
	}
	jms, err := rpc.DialAll(addr, opts...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	leader, jm, err := jms.Leader(ctx)
	if err != nil {
		jms.Close()
		return nil, fmt.Errorf("%w: %w", ErrJobManager, err)
	}
	return &client{addr: leader, tls: access.tlsOn(), jm: jm, cc: jms, opts: opts}, nil
}

func (c *client) Close() { _ = c.cc.Close() }

// refusedByStandby reports whether err is a standby's refusal of a call:
// it did nothing, so the call may be made again on the leader.
func refusedByStandby(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.Unavailable && strings.Contains(st.Message(), "standby")
}

// follow connects c to the leader the standby it is connected to names,
// once per client (a standby named by the user's only address, or a
// leader that stepped down since it was found). It fails when no job
// manager leads or the leader is c's own address (no loop).
func (c *client) follow(ctx context.Context) error {
	if c.followed {
		return errors.New("already followed the leader once")
	}
	c.followed = true
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := c.jm.Leader(actx, &weirpb.LeaderRequest{})
	if err != nil {
		return err
	}
	if info.Leading || info.LeaderAddress == "" || info.LeaderAddress == c.addr {
		return errors.New("no other job manager leads")
	}
	jms, err := rpc.DialAll(info.LeaderAddress, c.opts...)
	if err != nil {
		return err
	}
	_, jm, err := jms.Leader(ctx)
	if err != nil {
		jms.Close()
		return err
	}
	old := c.cc
	c.cc = closers{jms, old}
	c.addr, c.jm = info.LeaderAddress, jm
	return nil
}

// closers closes each in turn.
type closers []interface{ Close() error }

func (cs closers) Close() error {
	var errs []error
	for _, c := range cs {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// explain turns a call's error into what the user needs to read.
func (c *client) explain(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.Unauthenticated:
		return fmt.Errorf("%w at %s refused the call: %s (give its token with --auth-token-file)", ErrJobManager, c.addr, st.Message())
	case codes.Unavailable, codes.DeadlineExceeded:
		switch {
		case strings.Contains(st.Message(), "etcd unreachable"): // running again cannot help
			return fmt.Errorf("%w at %s: %s (the job managers cannot reach etcd: no job manager leads until they do)", ErrJobManager, c.addr, st.Message())
		case strings.Contains(st.Message(), "standby"): // the leader changed since this client found it
			return fmt.Errorf("%w at %s: %s (run the command again: it finds the leader)", ErrJobManager, c.addr, st.Message())
		}
		hint := ""
		if !c.tls && plaintextToTLS(st.Message()) {
			hint = " (it may serve TLS: give --tls or --tls-ca)"
		}
		return fmt.Errorf("%w at %s is unreachable (is `streamctl jobmanager` running there? set --jobmanager or %s): %s%s",
			ErrJobManager, c.addr, envJobManager, st.Message(), hint)
	}
	return fmt.Errorf("%w: %s", ErrJobManager, st.Message())
}

// plaintextToTLS reports whether msg, the message of a failed call made
// without TLS, is what a TLS server makes a plaintext gRPC client see: the
// server reads the client's preface as a bad TLS record and hangs up, so
// the client reads EOF (or a reset) where the server's preface should be.
func plaintextToTLS(msg string) bool {
	if !strings.Contains(msg, "server preface") {
		return false
	}
	return strings.Contains(msg, "EOF") || strings.Contains(msg, "connection reset")
}

// call makes the call fn with c (which reads c.jm when it runs). A call a
// standby refused is made again, once, on the leader the standby names.
func (c *client) call(ctx context.Context, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	err := fn(ctx)
	if refusedByStandby(err) && c.follow(ctx) == nil {
		err = fn(ctx)
	}
	if err != nil {
		return c.explain(err)
	}
	return nil
}

// clientCmd adds --jobmanager and --output to a client command.
type clientCmd struct {
	jm, output string
	access     accessFlags
}

func (f *clientCmd) flags(cmd *cobra.Command, output bool) {
	cmd.Flags().StringVar(&f.jm, "jobmanager", defaultJobManager(), "job manager address, or several comma-separated (a highly available cluster: the leader is found) (default $"+envJobManager+" or 127.0.0.1:6123)")
	f.access.add(cmd)
	if output {
		cmd.Flags().StringVarP(&f.output, "output", "o", "table", "table|json")
	}
}

// checkOutput refuses an --output other than table or json.
func (f *clientCmd) checkOutput(cmd *cobra.Command) error {
	if f.output != "" && f.output != "table" && f.output != "json" {
		return flagError(cmd, fmt.Errorf("invalid --output %q: want table or json", f.output))
	}
	return nil
}

// runE returns a command's RunE that checks --output, dials the job
// manager and makes one call with fn.
func (f *clientCmd) runE(a *app, fn func(ctx context.Context, cmd *cobra.Command, c *client) error) func(*cobra.Command, []string) error {
	return a.withLogger(func(cmd *cobra.Command, _ *zap.Logger) error {
		if err := f.checkOutput(cmd); err != nil {
			return err
		}
		c, err := dialJobManager(f.jm, &f.access)
		if err != nil {
			return err
		}
		defer c.Close()
		return c.call(cmd.Context(), func(ctx context.Context) error { return fn(ctx, cmd, c) })
	})
}

// jobJSON is a job's status as --output json prints it.
type jobJSON struct {
	ID                      string            `json:"id"`
	Name                    string            `json:"name"`
	State                   string            `json:"state"`
	Restarts                int32             `json:"restarts"`
	LastCompletedCheckpoint uint64            `json:"last_completed_checkpoint"`
	Error                   string            `json:"error"`
	Params                  map[string]string `json:"params"`
	Submitted               string            `json:"submitted,omitempty"`
	CheckpointIntervalMs    int64             `json:"checkpoint_interval_ms"`
	CheckpointTimeoutMs     int64             `json:"checkpoint_timeout_ms"`
	RestartStrategy         string            `json:"restart_strategy"`
	StateBackend            string            `json:"state_backend"`
	RestoredFromCheckpoint  uint64            `json:"restored_from_checkpoint"`
	RecordsIn               int64             `json:"records_in"`
	RecordsOut              int64             `json:"records_out"`
	JobType                 string            `json:"job_type"`
	// Waiting says why a CREATED or RESTARTING job is not running yet.
	Waiting     string          `json:"waiting"`
	LastFailure *jobFailureJSON `json:"last_failure"`
	// RetainedSavepoint is where a cancelled job submitted with
	// --retain-on-cancel left its latest checkpoint ("": none).
	RetainedSavepoint string `json:"retained_savepoint,omitempty"`
	// NextAttemptAt is when a RESTARTING job's next attempt starts, its
	// restart strategy's delay over (RFC 3339; absent when it waits for
	// none).
	NextAttemptAt string `json:"next_attempt_at,omitempty"`
}

// jobFailureJSON is a job's latest failure as --output json prints it.
type jobFailureJSON struct {
	Time        string `json:"time"`
	Message     string `json:"message"`
	Task        string `json:"task"`
	TaskManager string `json:"task_manager"`
	Restarted   bool   `json:"restarted"`
}

func toJobJSON(s *weirpb.JobStatus) jobJSON {
	j := jobJSON{ID: s.Id, Name: s.Name, State: s.State, JobType: s.JobType, Waiting: s.Waiting, Restarts: s.Restarts, LastCompletedCheckpoint: s.LastCompletedCheckpoint,
		Error: s.Error, Params: s.Params, CheckpointIntervalMs: s.CheckpointIntervalMs, CheckpointTimeoutMs: s.CheckpointTimeoutMs, RestartStrategy: s.RestartStrategy,
		RestoredFromCheckpoint: s.RestoredFromCheckpoint, RecordsIn: s.RecordsIn, RecordsOut: s.RecordsOut,
		RetainedSavepoint: s.RetainedSavepoint, StateBackend: s.StateBackend}
	if j.Params == nil {
		j.Params = map[string]string{}
	}
	if s.SubmittedUnixMs > 0 {
		j.Submitted = time.UnixMilli(s.SubmittedUnixMs).UTC().Format(time.RFC3339)
	}
	if s.NextAttemptUnixMs > 0 {
		j.NextAttemptAt = time.UnixMilli(s.NextAttemptUnixMs).UTC().Format(time.RFC3339Nano)
	}
	if f := s.LastFailure; f != nil {
		j.LastFailure = &jobFailureJSON{Time: failureTime(f), Message: f.Message, Task: f.Task, TaskManager: f.TaskManager, Restarted: f.Restarted}
	}
	return j
}

// failureTime is when f happened, as status and list print it.
func failureTime(f *weirpb.JobFailure) string {
	return time.UnixMilli(f.UnixMs).UTC().Format(time.RFC3339)
}

// stateOf is a job's state as the tables print it, with why it waits and,
// while the restart strategy's delay runs, when its next attempt starts.
func stateOf(j *weirpb.JobStatus) string {
	var why []string
	if j.NextAttemptUnixMs > 0 {
		at := time.UnixMilli(j.NextAttemptUnixMs)
		next := "next attempt at " + at.UTC().Format(time.RFC3339)
		if in := time.Until(at); in > 0 {
			next += ", in " + in.Round(time.Second).String()
		}
		why = append(why, next)
	}
	if j.Waiting != "" {
		why = append(why, j.Waiting)
	}
	if len(why) == 0 {
		return j.State
	}
	return fmt.Sprintf("%s (%s)", j.State, strings.Join(why, "; "))
}

// failureLine says where and when f happened and what it was.
func failureLine(f *weirpb.JobFailure) string {
	where := ""
	if f.Task != "" {
		where += " in " + f.Task
	}
	if f.TaskManager != "" {
		where += " on " + f.TaskManager
	}
	then := "the job failed"
	if f.Restarted {
		then = "the job restarted"
	}
	return fmt.Sprintf("last failure at %s%s (%s): %s", failureTime(f), where, then, f.Message)
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func printJobs(w io.Writer, output string, jobs []*weirpb.JobStatus, one bool) error {
	if output == "json" {
		if one {
			return printJSON(w, toJobJSON(jobs[0]))
		}
		out := []jobJSON{}
		for _, j := range jobs {
			out = append(out, toJobJSON(j))
		}
		return printJSON(w, out)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSTATE\tRESTARTS\tLAST CHECKPOINT\tRECORDS IN\tRECORDS OUT\tLAST FAILURE\tERROR")
	for _, j := range jobs {
		failed := "-"
		if j.LastFailure != nil {
			failed = failureTime(j.LastFailure)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", j.Id, j.Name, stateOf(j), j.Restarts, j.LastCompletedCheckpoint,
			j.RecordsIn, j.RecordsOut, failed, j.Error)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if one && jobs[0].StateBackend != "" {
		if _, err := fmt.Fprintf(w, "state backend: %s\n", jobs[0].StateBackend); err != nil {
			return err
		}
	}
	if one && jobs[0].LastFailure != nil {
		if _, err := fmt.Fprintln(w, failureLine(jobs[0].LastFailure)); err != nil {
			return err
		}
	}
	if one && jobs[0].RetainedSavepoint != "" {
		_, err := fmt.Fprintf(w, "retained checkpoint: %s (start a job from it with --from-savepoint)\n", jobs[0].RetainedSavepoint)
		return err
	}
	return nil
}

func newSubmitCmd(a *app) *cobra.Command {
	var (
		f       clientCmd
		jf      jobFlags
		restart string
		name    string
		wait    bool
		from    savepointStart
		retain  bool
	)
	cmd := &cobra.Command{
		Use:   "submit JOB [--jobmanager ADDR] [--parallelism N] [--checkpoint-interval DUR] [--set key=value]... [--restart-strategy SPEC] [--name NAME] [--from-savepoint PATH [--allow-non-restored-state]] [--retain-on-cancel] [--wait]",
		Short: "Submit a registered job to the job manager; prints its job id",
		Long: `submit asks the job manager to run the registered job type JOB with the given
parameters (--set key=value, repeatable; "streamctl jobs" lists them) on its
task managers. The job manager checks the job type, the parameters and that
its task managers offer enough slots (a job needs as many as its largest
parallelism), records the job durably and prints its new job id alone on
stdout. Each submission is a new job: its transactional ids derive from the
id, so two jobs of one type never fence each other.

--restart-strategy is Flink's (default exponential-delay):
  none | fixed-delay:attempts=3,delay=1s
  exponential-delay:initial-backoff=1s,max-backoff=1m,multiplier=1.5,reset-backoff-threshold=1h,jitter=0.1
  failure-rate:max-failures=3,interval=1m,delay=1s

--from-savepoint starts the job from a savepoint ("streamctl savepoint", "stop
--savepoint"), a directory the job manager reads (a path on its machine; a
savepoint from another cluster works once copied there) or a savepoint URL
(s3://bucket/prefix/savepoint-...?endpoint=..., read with the job manager's
--checkpoint-storage credentials): operators are
matched by UID, keyed state is spread over the key groups at the new
parallelism (up to the savepoint's max parallelism), an operator the
savepoint does not know starts empty, and the savepoint's pending
transactions are committed as a restored checkpoint's. A savepoint with state
of an operator the job no longer has is refused unless
--allow-non-restored-state drops that state. A damaged or truncated savepoint
is refused with an error naming the file, and no job is created.

--retain-on-cancel (Flink's retained externalized checkpoints): when the job is
cancelled, the job manager writes its latest completed checkpoint (the one
whose output the cancel committed) out as a savepoint directory under its
--savepoint-dir (else its --data-dir's "retained"); cancel and status print
where. --from-savepoint starts a job from it.

--wait follows the job until it ends, with a progress line on stderr (state,
restarts, last completed checkpoint, records in and out of the current
attempt), and exits non-zero unless it FINISHED
or was CANCELED. A streaming job never ends: Ctrl-C stops following it and
the job runs on.`,
		Args: cobra.ExactArgs(1),
		RunE: a.withLogger(func(cmd *cobra.Command, log *zap.Logger) error {
			params, err := jf.params(cmd)
			if err != nil {
				return err
			}
			if restart != "" {
				if _, err := runtime.ParseRestartStrategy(restart); err != nil {
					return flagError(cmd, fmt.Errorf("--restart-strategy: %w", err))
				}
			}
			c, err := dialJobManager(f.jm, &f.access)
			if err != nil {
				return err
			}
			defer c.Close()
			var id string
			err = c.call(cmd.Context(), func(ctx context.Context) error {
				r, err := c.jm.SubmitJob(ctx, &weirpb.SubmitJobRequest{JobType: cmd.Flags().Arg(0), Params: params,
					CheckpointIntervalMs: jf.interval.Milliseconds(), CheckpointTimeoutMs: jf.timeout.Milliseconds(), RestartStrategy: restart, Name: name,
					FromSavepoint: from.path, AllowNonRestoredState: from.allowNonRestored, RetainOnCancel: retain})
				if err == nil {
					id = r.JobId
				}
				return err
			})
			if err != nil {
				return err
			}
			fmt.Fprintln(a.stdout, id)
			if !wait {
				return nil
			}
			return a.follow(cmd.Context(), c, id, log)
		}),
	}
	f.flags(cmd, false)
	jf.add(cmd)
	cmd.Flags().StringVar(&restart, "restart-strategy", "", "restart strategy (default exponential-delay)")
	cmd.Flags().StringVar(&name, "name", "", "the job's name, shown by list, status and REST (default: its job type)")
	cmd.Flags().BoolVar(&wait, "wait", false, "follow the job until it ends (a streaming job never does; Ctrl-C stops following)")
	from.add(cmd, "read by the job manager, on its machine")
	cmd.Flags().BoolVar(&retain, "retain-on-cancel", false,
		"when the job is cancelled, write its latest completed checkpoint out as a savepoint (under the job manager's --savepoint-dir, else DATA_DIR/retained); cancel and status print it")
	return cmd
}

// follow polls job id until it ends, drawing the progress line.
func (a *app) follow(ctx context.Context, c *client, id string, log *zap.Logger) error {
	pl := a.progress(log)
	defer pl.Update("")
	for {
		var st *weirpb.JobStatus
		if err := c.call(ctx, func(ctx context.Context) (err error) {
			st, err = c.jm.GetJob(ctx, &weirpb.GetJobRequest{JobId: id})
			return err
		}); err != nil {
			if ctx.Err() != nil {
				return nil // the user stopped following; the job runs on
			}
			return err
		}
		pl.Update(fmt.Sprintf("job %s: %s, %d restarts, last completed checkpoint %d, records in %d, out %d (this attempt)",
			id, stateOf(st), st.Restarts, st.LastCompletedCheckpoint, st.RecordsIn, st.RecordsOut))
		switch st.State {
		case "FINISHED", "CANCELED":
			pl.Update("")
			log.Info("job ended", zap.String("job_id", id), zap.String("state", st.State))
			return nil
		case "FAILED":
			return fmt.Errorf("job %s failed: %s", id, st.Error)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func newListCmd(a *app) *cobra.Command {
	var f clientCmd
	cmd := &cobra.Command{
		Use:   "list [--jobmanager ADDR] [--output table|json]",
		Short: "List the job manager's jobs, newest first",
		Long: `list shows every job of the job manager, newest first: its id, name, state
(with why a CREATED or RESTARTING job waits, e.g. "waiting for 2 slots, 0
free"), restarts, last completed checkpoint, the records its current (or, once
it ended, its last) attempt read and wrote, when it last failed, and the error
that failed it. "streamctl status JOB_ID" shows the last failure in full.`,
		Args: cobra.NoArgs,
		RunE: f.runE(a, func(ctx context.Context, _ *cobra.Command, c *client) error {
			r, err := c.jm.ListJobs(ctx, &weirpb.ListJobsRequest{})
			if err != nil {
				return err
			}
			return printJobs(a.stdout, f.output, r.Jobs, false)
		}),
	}
	f.flags(cmd, true)
	return cmd
}

func newStatusCmd(a *app) *cobra.Command {
	var f clientCmd
	cmd := &cobra.Command{
		Use:   "status JOB_ID [--jobmanager ADDR] [--output table|json]",
		Short: "Show a job's state, restarts and last completed checkpoint",
		Long: `status shows one job: its state (CREATED, RUNNING, RESTARTING, FAILED,
CANCELED, FINISHED), how often it restarted, its last completed checkpoint, and
the error that failed it, its state backend ("state backend: pebble";
state_backend in --output json), why it waits if it is CREATED or RESTARTING
("waiting for 2 slots, 0 free"; while the restart strategy's delay runs, when
the next attempt starts: "next attempt at TIME, in 42s", next_attempt_at in
--output json), and its last failure: when, in which task on
which task manager, and what (the whole history is on the REST API at
GET /jobs/JOB_ID/exceptions).`,
		Args: cobra.ExactArgs(1),
		RunE: f.runE(a, func(ctx context.Context, cmd *cobra.Command, c *client) error {
			st, err := c.jm.GetJob(ctx, &weirpb.GetJobRequest{JobId: cmd.Flags().Arg(0)})
			if err != nil {
				return err
			}
			return printJobs(a.stdout, f.output, []*weirpb.JobStatus{st}, true)
		}),
	}
	f.flags(cmd, true)
	return cmd
}

func newCancelCmd(a *app) *cobra.Command {
	var f clientCmd
	cmd := &cobra.Command{
		Use:   "cancel JOB_ID [--jobmanager ADDR] [--output table|json]",
		Short: "Cancel a job: its tasks stop, open transactions are aborted, held share records released",
		Long: `cancel cancels a running job and returns once its tasks stopped: the
checkpoint coordinator stops first (no checkpoint completes after that), then
every task is cancelled for good, so its transactional operators abort their
open transactions and the share-group sources release the records they hold.
It prints the job's final status.`,
		Args: cobra.ExactArgs(1),
		RunE: f.runE(a, func(ctx context.Context, cmd *cobra.Command, c *client) error {
			st, err := c.jm.CancelJob(ctx, &weirpb.CancelJobRequest{JobId: cmd.Flags().Arg(0)})
			if err != nil {
				return err
			}
			return printJobs(a.stdout, f.output, []*weirpb.JobStatus{st}, true)
		}),
	}
	f.flags(cmd, true)
	return cmd
}

// checkpointJSON is one checkpoint as --output json prints it.
type checkpointJSON struct {
	ID         uint64 `json:"id"`
	Triggered  string `json:"triggered,omitempty"`
	Completed  string `json:"completed,omitempty"`
	DurationMs int64  `json:"duration_ms"`
	SizeBytes  int64  `json:"size_bytes"`
	Tasks      int32  `json:"tasks"`
	// SyncMs and AsyncMs are the longest synchronous and asynchronous
	// parts of a task's snapshot, when the job manager saw the
	// acknowledgements (it keeps them in memory).
	SyncMs  *int64 `json:"sync_ms,omitempty"`
	AsyncMs *int64 `json:"async_ms,omitempty"`
	Error   string `json:"error,omitempty"`
}

func newCheckpointsCmd(a *app) *cobra.Command {
	var f clientCmd
	cmd := &cobra.Command{
		Use:   "checkpoints JOB_ID [--jobmanager ADDR] [--output table|json]",
		Short: "List a job's retained completed checkpoints, newest first",
		Long: `checkpoints lists a job's retained completed checkpoints, newest first: id,
completion time, duration (trigger to completion), full size, tasks, and the
longest synchronous (SYNC) and asynchronous (ASYNC) part of a task's snapshot
("-" when this job manager did not see the acknowledgements: it keeps them in
memory). Per subtask: GET /jobs/{id}/checkpoints/details/{cid}/subtasks/{vid}.`,
		Args: cobra.ExactArgs(1),
		RunE: f.runE(a, func(ctx context.Context, cmd *cobra.Command, c *client) error {
			r, err := c.jm.ListCheckpoints(ctx, &weirpb.ListCheckpointsRequest{JobId: cmd.Flags().Arg(0)})
			if err != nil {
				return err
			}
			out := []checkpointJSON{}
			for _, ci := range r.Checkpoints {
				cj := checkpointJSON{ID: ci.Id, DurationMs: ci.DurationMs, SizeBytes: ci.SizeBytes, Tasks: ci.Tasks, Error: ci.Error}
				if ci.TaskTimes {
					cj.SyncMs, cj.AsyncMs = &ci.SyncMs, &ci.AsyncMs
				}
				if ci.CompletedUnixMs > 0 {
					cj.Completed = time.UnixMilli(ci.CompletedUnixMs).UTC().Format(time.RFC3339Nano)
					cj.Triggered = time.UnixMilli(ci.TriggeredUnixMs).UTC().Format(time.RFC3339Nano)
				}
				out = append(out, cj)
			}
			if f.output == "json" {
				return printJSON(a.stdout, out)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tCOMPLETED\tDURATION\tSIZE\tTASKS\tSYNC\tASYNC\tERROR")
			ms := func(v *int64) string {
				if v == nil {
					return "-"
				}
				return (time.Duration(*v) * time.Millisecond).String()
			}
			for _, cj := range out {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", cj.ID, cj.Completed, time.Duration(cj.DurationMs)*time.Millisecond,
					strconv.FormatInt(cj.SizeBytes, 10), cj.Tasks, ms(cj.SyncMs), ms(cj.AsyncMs), cj.Error)
			}
			return tw.Flush()
		}),
	}
	f.flags(cmd, true)
	return cmd
}
