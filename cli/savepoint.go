package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/weirstream/weir/internal/rpc/weirpb"
)

// savepointCallTimeout bounds a savepoint or stop call: the job manager
// answers once the savepoint is written (and, for a stop, the job ended).
const savepointCallTimeout = 10 * time.Minute

// savepointFlags are the flags savepoint and stop share.
type savepointFlags struct {
	f clientCmd
}

// trigger asks the job manager for a savepoint of job and prints where it
// was written.
func (s *savepointFlags) trigger(a *app, cmd *cobra.Command, req *weirpb.TriggerSavepointRequest) error {
	c, err := dialJobManager(s.f.jm, &s.f.access)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(cmd.Context(), savepointCallTimeout)
	defer cancel()
	r, err := c.jm.TriggerSavepoint(ctx, req)
	if refusedByStandby(err) && c.follow(ctx) == nil {
		r, err = c.jm.TriggerSavepoint(ctx, req)
	}
	if err != nil {
		return c.explain(err)
	}
	if s.f.output == "json" {
		return printJSON(a.stdout, struct {
			Job        string `json:"job"`
			Location   string `json:"location"`
			Checkpoint uint64 `json:"checkpoint"`
			TriggerID  string `json:"trigger_id"`
		}{req.JobId, r.Location, r.CheckpointId, r.TriggerId})
	}
	fmt.Fprintln(a.stdout, r.Location)
	return nil
}

// newSavepointCmd is "savepoint JOB_ID [--target DIR]". Subcommands that
// work on a savepoint directory (inspect) sit beside it.
func newSavepointCmd(a *app) *cobra.Command {
	var (
		s      savepointFlags
		target string
	)
	cmd := &cobra.Command{
		Use:   "savepoint JOB_ID [--target DIR] [--jobmanager ADDR]",
		Short: "Take a savepoint of a running job; prints its directory",
		Long: `savepoint takes a savepoint of the running job JOB_ID: a checkpoint like the
periodic ones (barriers, alignment, its transactions committed when it
completes) that the job manager also writes out, self-contained, into a new
directory savepoint-<job>-<checkpoint> under --target (default: the job
manager's --savepoint-dir; without either it fails). The directory is the job
manager's: a path on its machine. --target may instead be a URL of object
storage, s3://bucket/prefix?endpoint=...&region=... (any S3-compatible store;
the job manager opens it with its --checkpoint-storage credentials, the
standard AWS way) or file:///abs/dir: the savepoint is then the same objects
under s3://bucket/prefix/savepoint-<job>-<checkpoint>. It is never deleted by
Weir, can be copied elsewhere (between a directory and object storage too),
and starts a job again with "submit --from-savepoint" (or "run
--from-savepoint"), at another parallelism or with another version of the job.
It prints the savepoint's location once written; the job goes on running.`,
		Args: cobra.ExactArgs(1),
		RunE: a.withLogger(func(cmd *cobra.Command, _ *zap.Logger) error {
			if err := s.f.checkOutput(cmd); err != nil {
				return err
			}
			return s.trigger(a, cmd, &weirpb.TriggerSavepointRequest{JobId: cmd.Flags().Arg(0), TargetDirectory: target})
		}),
	}
	s.f.flags(cmd, true)
	cmd.Flags().StringVar(&target, "target", "", "directory or savepoint URL (s3://bucket/prefix?endpoint=...) under which the savepoint is written (default: the job manager's --savepoint-dir)")
	cmd.AddCommand(newSavepointInspectCmd(a))
	return cmd
}

// newStopCmd is "stop JOB_ID --savepoint DIR [--drain]".
func newStopCmd(a *app) *cobra.Command {
	var (
		s     savepointFlags
		dir   string
		drain bool
	)
	cmd := &cobra.Command{
		Use:   "stop JOB_ID --savepoint DIR [--drain] [--jobmanager ADDR]",
		Short: "Stop a job with a savepoint: its final checkpoint is the savepoint, it ends FINISHED",
		Long: `stop ends the running job JOB_ID with a savepoint (Flink's stop-with-savepoint):
once the savepoint's checkpoint is triggered no other checkpoint is, the
savepoint completes and its transactions commit, it is written into a new
directory under --savepoint DIR (a path on the job manager's machine, or a
URL of object storage as savepoint --target takes; default its
--savepoint-dir), and then the job's tasks stop: what they read after the
savepoint's barrier is rolled back (its transactions aborted, its share-group
records released for the next job), so the savepoint holds exactly what the
job's committed output reflects. The job ends FINISHED. If the savepoint
fails, the job goes on running and stop fails.

It prints the savepoint's directory once the job ended; "submit
--from-savepoint DIR" continues the job from it.

With --drain (Flink's stop --drain), when the savepoint's trigger reaches
a source task it stops reading (no poll after it) and emits the final
watermark before the savepoint's barrier: every event-time window and timer
downstream fires first, its output goes into the savepoint's transactions
(committed with it), and the savepoint holds the state after they fired. Use
it to end a job for good; without it, open windows stay in the savepoint
and fire after a restore. A drain savepoint that fails after the final
watermark went out fails the job over to its latest completed checkpoint
(the drained output rolled back if the savepoint was aborted, committed
once if only writing it out failed): the job reads on.`,
		Args: cobra.ExactArgs(1),
		RunE: a.withLogger(func(cmd *cobra.Command, _ *zap.Logger) error {
			if err := s.f.checkOutput(cmd); err != nil {
				return err
			}
			return s.trigger(a, cmd, &weirpb.TriggerSavepointRequest{JobId: cmd.Flags().Arg(0), TargetDirectory: dir,
				Stop: true, Drain: drain})
		}),
	}
	s.f.flags(cmd, true)
	cmd.Flags().StringVar(&dir, "savepoint", "", "directory or savepoint URL (s3://bucket/prefix?endpoint=...) under which the savepoint is written (default: the job manager's --savepoint-dir)")
	cmd.Flags().BoolVar(&drain, "drain", false, "stop reading and emit the final watermark before the savepoint: every event-time window and timer fires into it")
	return cmd
}

// savepointStart are the flags that start a job from a savepoint (submit,
// run).
type savepointStart struct {
	path             string
	allowNonRestored bool
}

func (s *savepointStart) add(cmd *cobra.Command, where string) {
	cmd.Flags().StringVar(&s.path, "from-savepoint", "", "start the job from the savepoint in this directory or at this savepoint URL ("+where+")")
	cmd.Flags().BoolVar(&s.allowNonRestored, "allow-non-restored-state", false,
		"with --from-savepoint: drop the savepoint's state of operators the job no longer has (refused otherwise)")
}
