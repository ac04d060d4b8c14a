package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/internal/atomicfile"
	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/runtime"
)

// jobIDFile is the file in a --checkpoint-dir that keeps the id of the job
// whose checkpoints the directory holds.
const jobIDFile = "job-id"

func newRunCmd(a *app) *cobra.Command {
	var (
		jf       jobFlags
		dir      string
		from     savepointStart
		retain   runRetain
		stor     storageFlags
		stateMem byteSize
	)
	cmd := &cobra.Command{
		Use:   "run JOB [--parallelism N] [--checkpoint-interval DUR] [--checkpoint-dir DIR] [--set key=value]... [--from-savepoint PATH [--allow-non-restored-state]] [--retain-on-cancel [--savepoint-dir DIR]]",
		Short: "Run a registered job in this process against an external broker",
		Long: `run builds the registered job type JOB from its parameters (--set key=value,
repeatable; "streamctl jobs" lists them, e.g. --set brokers=HOST:PORT) and runs
it in this process on the mini cluster: every subtask a goroutine, checkpoints
every --checkpoint-interval, restarts from the latest completed checkpoint under
the default restart strategy (fixed-delay, 10 attempts, 100ms apart).

--checkpoint-dir keeps completed checkpoints (and the pending transaction
handles) in a pebble store there, with the job's id in DIR/job-id: a process
killed and started again on the same directory restores its latest completed
checkpoint and continues exactly-once. Task state above --state-inline-limit
goes to checkpoint storage, by default file://DIR/storage (Flink's
state.checkpoints.dir keeps state files beside the metadata the same way), so
the store holds metadata and references. The job id names the job's
transactional ids, so two runs on different directories never fence each
other. Without --checkpoint-dir, checkpoints live in memory and a new process
starts from scratch with a new job id.

--from-savepoint starts the job from a savepoint directory or URL (credentials
the standard AWS way) as submit's does
(operators matched by UID, any parallelism up to the savepoint's max
parallelism, its pending transactions committed; state of an operator the job
no longer has refused unless --allow-non-restored-state). With
--checkpoint-dir it is used only while the directory holds no checkpoint of
the job: a restarted process continues from its own latest checkpoint.

--retain-on-cancel (Flink's retained externalized checkpoints, as submit's):
when the job is cancelled (SIGINT/SIGTERM), its latest completed checkpoint,
the one whose output the cancel committed, is written out as a savepoint
directory retained-<job id prefix>-<checkpoint id> under --savepoint-dir, else
under --checkpoint-dir's "retained", and its path printed ("retained
checkpoint: PATH"); run --from-savepoint PATH continues the job from it.

--parallelism sets the job's default parallelism (the reserved parameter
"parallelism"; 0 keeps the job type's). --state-backend pebble keeps the job's
keyed state and timers in pebble instances under --checkpoint-dir's "state"
(emptied at start; else a temporary directory), in at most --state-memory of memory, rather than on the Go heap (see
docs/guide/state-backends.md); checkpoints and savepoints are the same on both. A bounded job ends when its input does;
a streaming one runs until SIGINT/SIGTERM, which cancels it cleanly (its open
transactions are aborted, its held share records released).`,
		Args: cobra.ExactArgs(1),
		RunE: a.withLogger(func(cmd *cobra.Command, log *zap.Logger) error {
			params, err := jf.params(cmd)
			if err != nil {
				return err
			}
			if retain.on && retain.dir == "" && dir == "" {
				return flagError(cmd, errors.New("--retain-on-cancel needs --savepoint-dir or --checkpoint-dir (its retained directory) to write the savepoint into"))
			}
			job, err := a.reg.Build(cmd.Flags().Arg(0), params)
			if err != nil {
				return err
			}
			fp, err := failpoint.FromEnv()
			if err != nil {
				return err
			}
			opts := []runtime.ClusterOpt{runtime.Logger(log), runtime.CheckpointInterval(jf.interval), runtime.Failpoints(fp),
				runtime.StateMemoryLimit(int64(stateMem))}
			if jf.timeout > 0 {
				opts = append(opts, runtime.CheckpointTimeout(jf.timeout))
			}
			if from.path != "" {
				c, err := checkpoint.ReadSavepoint(cmd.Context(), from.path)
				if err != nil {
					return err
				}
				if err := runtime.CheckRestore(job, c, from.allowNonRestored); err != nil {
					return fmt.Errorf("savepoint %s: %w", from.path, err)
				}
				opts = append(opts, runtime.StartFrom(c))
			}
			if from.allowNonRestored {
				opts = append(opts, runtime.AllowNonRestoredState())
			}
			id, err := runJobID(dir)
			if err != nil {
				return err
			}
			opts = append(opts, runtime.JobID(id))
			if dir != "" {
				opts = append(opts, runtime.StateMemoryDir(filepath.Join(dir, "state")))
			}
			// The store is this command's, so that a cancelled job's latest
			// checkpoint can be retained after the job ended.
			store, err := openRunStore(dir, log)
			if err != nil {
				return err
			}
			defer store.Close()
			opts = append(opts, runtime.CheckpointStore(store))
			if err := stor.check(cmd); err != nil {
				return err
			}
			if stor.url == "" && dir != "" {
				if stor.url, err = runStorageURL(dir); err != nil {
					return fmt.Errorf("run: --checkpoint-dir: %w", err)
				}
			}
			var st storage.Storage
			if stor.url != "" {
				if st, err = storage.Open(cmd.Context(), stor.url); err != nil {
					return flagError(cmd, fmt.Errorf("--checkpoint-storage: %w", err))
				}
				defer st.Close()
				if err := probeStorage(cmd.Context(), st, stor.url); err != nil {
					return err
				}
				opts = append(opts, runtime.StateStorage(st, stor.url), runtime.StateInlineLimit(stor.inlineLimit()), runtime.OrphanGrace(stor.grace))
			}
			log.Info("running job", zap.String("job", cmd.Flags().Arg(0)), zap.String("job_id", id), zap.String("checkpoint_dir", dir))
			began := time.Now()
			res, err := runtime.NewMiniCluster(opts...).Run(cmd.Context(), job)
			took := time.Since(began)
			if err != nil && cmd.Context().Err() != nil && errors.Is(err, cmd.Context().Err()) {
				fmt.Fprintf(a.stdout, "job %s cancelled: %d restarts, last completed checkpoint %d, %s\n", id, res.Restarts, res.LastCheckpoint, recordsLine(res, took))
				if retain.on {
					return retain.write(a, checkpoint.Resolving(store, st, checkpoint.NativeDecoder(runtime.DecodeNativeState)), id, dir, cmd.Flags().Arg(0), params, log)
				}
				return nil
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "job %s finished: %d restarts, last completed checkpoint %d, %s\n", id, res.Restarts, res.LastCheckpoint, recordsLine(res, took))
			return nil
		}),
	}
	jf.add(cmd)
	cmd.Flags().StringVar(&dir, "checkpoint-dir", "", "directory for completed checkpoints (created); restarting on it continues the job")
	stor.add(cmd, false)
	cmd.Flags().Lookup("checkpoint-storage").Usage = "URL of the checkpoint storage task state is written to: file:///DIR, s3://BUCKET/PREFIX?endpoint=URL&region=R (credentials the standard AWS way) or mem:// (default: file://CHECKPOINT_DIR/storage with --checkpoint-dir, else none: state inline in the in-memory store)"
	addStateMemory(cmd, &stateMem)
	from.add(cmd, "in this process")
	cmd.Flags().BoolVar(&retain.on, "retain-on-cancel", false,
		"when the job is cancelled (SIGINT/SIGTERM), write its latest completed checkpoint out as a savepoint (under --savepoint-dir, else CHECKPOINT_DIR/retained) and print its path")
	cmd.Flags().StringVar(&retain.dir, "savepoint-dir", "", "directory or savepoint URL (s3://bucket/prefix?endpoint=...) --retain-on-cancel writes the retained savepoint under")
	return cmd
}

// runStorageURL is the checkpoint storage of a run --checkpoint-dir DIR
// given no --checkpoint-storage: file://DIR/storage. As Flink's
// state.checkpoints.dir, task state goes to files under the directory and
// only small snapshots stay inline in the store.
func runStorageURL(dir string) (string, error) {
	abs, err := filepath.Abs(filepath.Join(dir, "storage"))
	if err != nil {
		return "", err
	}
	return "file://" + abs, nil
}

// runRetain is run's --retain-on-cancel.
type runRetain struct {
	on  bool
	dir string // --savepoint-dir
}

// write writes the latest completed checkpoint of cancelled job id out as
// a savepoint under --savepoint-dir, else checkpointDir's "retained" (the
// job manager's rule for submit --retain-on-cancel), and prints its path.
func (r runRetain) write(a *app, from checkpoint.LatestReader, id, checkpointDir, jobType string, params map[string]string, log *zap.Logger) error {
	base := r.dir
	if base == "" {
		base = filepath.Join(checkpointDir, "retained")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The job's type and parameters let state dump decode it.
	sp, c, err := checkpoint.WriteRetained(ctx, from, id, base, time.Now(), checkpoint.WithJob(jobType, params))
	switch {
	case errors.Is(err, checkpoint.ErrNotFound):
		fmt.Fprintf(a.stdout, "job %s completed no checkpoint: nothing retained\n", id)
		return nil
	case err != nil:
		return fmt.Errorf("--retain-on-cancel: %w", err)
	}
	log.Info("retained the cancelled job's latest checkpoint as a savepoint", zap.String("location", sp), zap.Uint64("checkpoint", uint64(c.ID)))
	fmt.Fprintf(a.stdout, "retained checkpoint: %s (start a job from it with --from-savepoint)\n", sp)
	return nil
}

// openRunStore opens run's checkpoint store: a pebble store in
// checkpointDir's "checkpoints", or in memory without a directory.
func openRunStore(checkpointDir string, log *zap.Logger) (*checkpoint.Store, error) {
	opts := []checkpoint.StoreOpt{checkpoint.WithLogger(log)}
	dir := filepath.Join(checkpointDir, "checkpoints")
	if checkpointDir == "" {
		dir, opts = "checkpoints", append(opts, checkpoint.InMemory())
	}
	store, err := checkpoint.OpenStore(dir, opts...)
	if err != nil {
		return nil, fmt.Errorf("run: open checkpoint store: %w", err)
	}
	return store, nil
}

// jobFlags are the flags of the commands that start a job (run, submit).
type jobFlags struct {
	parallelism  int
	stateBackend string
	interval     time.Duration
	timeout      time.Duration
	sets         []string
}

func (j *jobFlags) add(cmd *cobra.Command) {
	cmd.Flags().IntVar(&j.parallelism, "parallelism", 0, "default parallelism of the job's operators (0: the job type's)")
	cmd.Flags().StringVar(&j.stateBackend, "state-backend", "", `where the job's keyed state lives: "heap" or "pebble" (the reserved parameter "state-backend"; default: heap)`)
	cmd.Flags().DurationVar(&j.interval, "checkpoint-interval", time.Second, "checkpoint trigger period, a whole number of milliseconds; also the least pause between two checkpoints")
	cmd.Flags().DurationVar(&j.timeout, "checkpoint-timeout", 0,
		"how long one of the job's checkpoints may take before it expires (0: the job manager's --checkpoint-timeout; run: "+runtime.DefaultCheckpointTimeout.String()+")")
	cmd.Flags().StringArrayVar(&j.sets, "set", nil, "job parameter key=value (repeatable)")
}

// params checks the flags and returns the job's parameters, --parallelism
// as the reserved parameter.
func (j *jobFlags) params(cmd *cobra.Command) (map[string]string, error) {
	params, err := parseSets(j.sets)
	if err != nil {
		return nil, flagError(cmd, err)
	}
	if j.parallelism < 0 {
		return nil, flagError(cmd, fmt.Errorf("--parallelism %d must not be negative", j.parallelism))
	}
	if j.parallelism > 0 {
		if v, ok := params[runtime.ParamParallelism]; ok && v != strconv.Itoa(j.parallelism) {
			return nil, flagError(cmd, fmt.Errorf("--parallelism %d and --set parallelism=%s disagree", j.parallelism, v))
		}
		params[runtime.ParamParallelism] = strconv.Itoa(j.parallelism)
	}
	if j.stateBackend != "" {
		k, err := runtime.ParseStateBackend(j.stateBackend)
		if err != nil {
			return nil, flagError(cmd, fmt.Errorf("--state-backend: %w", err))
		}
		if v, ok := params[runtime.ParamStateBackend]; ok && v != string(k) {
			return nil, flagError(cmd, fmt.Errorf("--state-backend %s and --set %s=%s disagree", k, runtime.ParamStateBackend, v))
		}
		params[runtime.ParamStateBackend] = string(k)
	}
	if j.interval <= 0 {
		return nil, flagError(cmd, fmt.Errorf("--checkpoint-interval %v must be positive", j.interval))
	}
	// The job manager keeps the interval in milliseconds: refuse what it
	// would silently change (500us became 0, then the default 1s).
	if j.interval%time.Millisecond != 0 {
		return nil, flagError(cmd, fmt.Errorf("--checkpoint-interval %v: want a whole number of milliseconds (at least 1ms)", j.interval))
	}
	if j.timeout < 0 || j.timeout%time.Millisecond != 0 {
		return nil, flagError(cmd, fmt.Errorf("--checkpoint-timeout %v: want a positive whole number of milliseconds, or 0 for the default", j.timeout))
	}
	return params, nil
}

// parseSets turns --set key=value flags into parameters, refusing a
// malformed or repeated one.
func parseSets(sets []string) (map[string]string, error) {
	params := map[string]string{}
	for _, s := range sets {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--set %q: want key=value", s)
		}
		if _, dup := params[k]; dup {
			return nil, fmt.Errorf("--set %s given twice", k)
		}
		params[k] = v
	}
	return params, nil
}

// runJobID returns the job id kept in dir (creating dir and the id on
// first use), or a new random id when dir is "".
func runJobID(dir string) (string, error) {
	if dir == "" {
		return newRunID()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("run: --checkpoint-dir: %w", err)
	}
	path := filepath.Join(dir, jobIDFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		id := strings.TrimSpace(string(b))
		if id == "" || strings.ContainsAny(id, " \t/") {
			return "", fmt.Errorf("run: --checkpoint-dir: %s holds no valid job id (%q); it is not a directory this command made", path, id)
		}
		return id, nil
	case !errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("run: --checkpoint-dir: %w", err)
	}
	id, err := newRunID()
	if err != nil {
		return "", err
	}
	// Written and synced before any checkpoint: a checkpoint is never
	// stored under an id the next process cannot find.
	if err := atomicfile.Write(path, []byte(id+"\n")); err != nil {
		return "", fmt.Errorf("run: --checkpoint-dir: %w", err)
	}
	return id, nil
}

func newRunID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("run: job id: %w", err)
	}
	return "run-" + hex.EncodeToString(b[:]), nil
}

// probeTimeout bounds the startup check of the checkpoint storage.
const probeTimeout = 30 * time.Second

// probeStorage checks at startup that the checkpoint storage at u can be
// written to (storage.Probe): a missing bucket fails the command now, not
// its first checkpoint.
func probeStorage(ctx context.Context, st storage.Storage, u string) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if err := storage.Probe(ctx, st); err != nil {
		return fmt.Errorf("--checkpoint-storage %s: %w", u, err)
	}
	return nil
}

// recordsLine says what the run's last attempt read and wrote, and how
// fast it read over took, the run's wall time (what a discarding sink
// would otherwise leave unsaid).
func recordsLine(res runtime.Result, took time.Duration) string {
	rate := 0.0
	if took > 0 {
		rate = float64(res.Records.In) / took.Seconds()
	}
	attempt := ""
	if res.Restarts > 0 {
		attempt = " (last attempt)"
	}
	return fmt.Sprintf("records in %d, out %d%s in %v (%.0f records/s in)", res.Records.In, res.Records.Out, attempt, took.Round(time.Millisecond), rate)
}
