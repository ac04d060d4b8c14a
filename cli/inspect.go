package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/jobmanager"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sources/kafka"
)

// snapshotFlags name the snapshot a command reads: a savepoint directory,
// or a checkpoint in a job manager's data directory or a run
// --checkpoint-dir.
type snapshotFlags struct {
	jobID      string
	checkpoint uint64
	storageURL string
}

func (f *snapshotFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.jobID, "job-id", "", "with a job manager data dir or run --checkpoint-dir: the job whose checkpoint to read (default: the directory's only job)")
	cmd.Flags().Uint64Var(&f.checkpoint, "checkpoint", 0, "with a job manager data dir or run --checkpoint-dir: the checkpoint id to read (default: the latest)")
	cmd.Flags().StringVar(&f.storageURL, "checkpoint-storage", "", "with a checkpoint whose task state is in checkpoint storage: its URL, to read the state from (as the job manager's --checkpoint-storage; default for a run --checkpoint-dir: its storage directory)")
}

const snapshotPathHelp = `PATH is a savepoint directory (it holds _metadata), a savepoint URL
(s3://bucket/prefix/savepoint-...?endpoint=..., credentials the standard AWS
way), or a retained checkpoint:
a job manager's --data-dir or a "streamctl run" --checkpoint-dir (each holds
checkpoints/, the checkpoint store), with --job-id ID (default: the
directory's only job; a run --checkpoint-dir names its job in job-id) and
--checkpoint N (default: the latest). The checkpoint store is opened
read-only and never changed; it cannot be read while a job manager or
"streamctl run" has it open (pebble locks it): stop that process first, or
take a savepoint and read that.`

// snapshot is a savepoint or a retained checkpoint, read and verified.
type snapshot struct {
	// Kind is "savepoint" or "checkpoint".
	Kind string
	Path string
	// Version is the savepoint format version (0 for a checkpoint).
	Version int
	// JobType and Params are the job's type and parameters when known
	// (recorded in the savepoint, or the job manager's job store).
	JobType string
	Params  map[string]string
	C       checkpoint.Completed
}

// errNotSnapshot is wrapped when PATH is neither a savepoint nor a
// directory with a checkpoint store.
var errNotSnapshot = errors.New("not a savepoint or a checkpoint directory")

// loadSnapshot reads the savepoint or retained checkpoint at path.
func loadSnapshot(ctx context.Context, path string, f snapshotFlags) (snapshot, error) {
	if _, err := os.Stat(filepath.Join(path, checkpoint.SavepointMetadataFile)); err == nil || checkpoint.IsSavepointURL(path) {
		if f.jobID != "" || f.checkpoint != 0 {
			return snapshot{}, fmt.Errorf("%s is a savepoint: --job-id and --checkpoint apply to checkpoint directories only", path)
		}
		info, err := checkpoint.ReadSavepointInfo(ctx, path)
		if err != nil {
			return snapshot{}, err
		}
		c, err := checkpoint.ReadSavepoint(ctx, path)
		if err != nil {
			return snapshot{}, err
		}
		return snapshot{Kind: "savepoint", Path: path, Version: info.Version, JobType: info.JobType, Params: info.JobParams, C: c}, nil
	}
	storeDir := filepath.Join(path, "checkpoints")
	if fi, err := os.Stat(storeDir); err != nil || !fi.IsDir() {
		if _, serr := os.Stat(path); serr != nil {
			return snapshot{}, fmt.Errorf("%w: %v", errNotSnapshot, serr)
		}
		return snapshot{}, fmt.Errorf("%w: %s has neither %s (a savepoint) nor checkpoints/ (a job manager data dir or run --checkpoint-dir)",
			errNotSnapshot, path, checkpoint.SavepointMetadataFile)
	}
	store, err := checkpoint.OpenStore(storeDir, checkpoint.ReadOnly())
	if err != nil {
		return snapshot{}, err
	}
	defer store.Close()
	job := f.jobID
	if job == "" {
		if b, err := os.ReadFile(filepath.Join(path, jobIDFile)); err == nil {
			job = strings.TrimSpace(string(b))
		}
	}
	if job == "" {
		jobs, err := store.Jobs(ctx)
		if err != nil {
			return snapshot{}, err
		}
		switch len(jobs) {
		case 0:
			return snapshot{}, fmt.Errorf("%s holds no checkpoint", storeDir)
		case 1:
			job = jobs[0]
		default:
			return snapshot{}, fmt.Errorf("%s holds checkpoints of %d jobs: choose one with --job-id (%s)", storeDir, len(jobs), strings.Join(jobs, ", "))
		}
	}
	var c checkpoint.Completed
	if f.checkpoint != 0 {
		c, err = store.Get(ctx, job, checkpoint.ID(f.checkpoint))
	} else {
		c, err = store.Latest(ctx, job)
	}
	if errors.Is(err, checkpoint.ErrNotFound) {
		sums, lerr := store.List(ctx, job)
		ids := make([]string, 0, len(sums))
		for _, s := range sums {
			ids = append(ids, strconv.FormatUint(uint64(s.ID), 10))
		}
		if lerr == nil && len(ids) > 0 {
			return snapshot{}, fmt.Errorf("%w (job %s has checkpoints %s)", err, job, strings.Join(ids, ", "))
		}
		return snapshot{}, fmt.Errorf("%w (job %s has no checkpoint in %s)", err, job, storeDir)
	}
	if err != nil {
		return snapshot{}, err
	}
	if refs := c.Refs(); len(refs) > 0 {
		url := f.storageURL
		if fi, err := os.Stat(filepath.Join(path, "storage")); url == "" && err == nil && fi.IsDir() {
			// A run --checkpoint-dir's own checkpoint storage.
			if url, err = runStorageURL(path); err != nil {
				return snapshot{}, err
			}
		}
		if url == "" {
			return snapshot{}, fmt.Errorf("checkpoint %d of job %s keeps its state in checkpoint storage (e.g. %s): give its URL with --checkpoint-storage", c.ID, job, refs[0].Key)
		}
		st, err := storage.Open(ctx, url)
		if err != nil {
			return snapshot{}, fmt.Errorf("--checkpoint-storage: %w", err)
		}
		defer st.Close()
		if c, err = checkpoint.Resolve(ctx, st, c, checkpoint.NativeDecoder(runtime.DecodeNativeState)); err != nil {
			return snapshot{}, err
		}
	}
	s := snapshot{Kind: "checkpoint", Path: path, C: c}
	if fi, err := os.Stat(filepath.Join(path, "jobs")); err == nil && fi.IsDir() {
		if rec, err := jobmanager.ReadJobRecord(filepath.Join(path, "jobs"), job); err == nil {
			s.JobType, s.Params = rec.Type, rec.Params
		}
	}
	return s, nil
}

// operators returns the snapshot's operator snapshots by UID, each
// operator's sorted by subtask, and the UIDs sorted.
func (s snapshot) operators() (map[string][]checkpoint.OperatorSnapshot, []string) {
	by := map[string][]checkpoint.OperatorSnapshot{}
	for _, ts := range s.C.Tasks {
		for _, op := range ts.Operators {
			by[op.UID] = append(by[op.UID], op)
		}
	}
	uids := make([]string, 0, len(by))
	for uid, ops := range by {
		sort.Slice(ops, func(i, j int) bool { return ops[i].Subtask < ops[j].Subtask })
		uids = append(uids, uid)
	}
	sort.Strings(uids)
	return by, uids
}

// inspection is what savepoint inspect reports (its JSON output).
type inspection struct {
	Kind          string            `json:"kind"`
	Path          string            `json:"path"`
	Job           string            `json:"job"`
	JobType       string            `json:"job_type,omitempty"`
	JobParams     map[string]string `json:"job_params,omitempty"`
	Checkpoint    uint64            `json:"checkpoint"`
	Time          time.Time         `json:"time"`
	FormatVersion int               `json:"format_version,omitempty"`
	Bytes         int64             `json:"bytes"`
	Operators     []inspectedOp     `json:"operators"`
}

type inspectedOp struct {
	UID            string             `json:"uid"`
	Parallelism    int                `json:"parallelism"`
	MaxParallelism int                `json:"max_parallelism,omitempty"`
	Subtasks       []inspectedSubtask `json:"subtasks"`
	States         []inspectedState   `json:"states,omitempty"`
	// StateError says why the keyed state could not be split by name.
	StateError string `json:"state_error,omitempty"`
	// BroadcastStates are the operator's broadcast states, by name, in
	// one subtask's copy (every subtask holds the same), when the job's
	// graph says the operator keeps broadcast state; BroadcastError says
	// why they could not be split.
	BroadcastStates []inspectedState       `json:"broadcast_states,omitempty"`
	BroadcastError  string                 `json:"broadcast_state_error,omitempty"`
	Handles         []checkpoint.TxnHandle `json:"pending_transactions,omitempty"`
	// Offsets are a Kafka partition source's positions (sources/kafka):
	// per partition, the offset of the next record to read, and the
	// subtask whose state holds it.
	Offsets []inspectedOffset `json:"partition_offsets,omitempty"`
}

type inspectedOffset struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	Subtask   int    `json:"subtask"`
}

// partitionOffsets decodes op's operator state as a Kafka partition
// source's offsets; nil when any entry is not one (another operator).
func partitionOffsets(ops []checkpoint.OperatorSnapshot) []inspectedOffset {
	var out []inspectedOffset
	for _, op := range ops {
		for _, e := range op.State {
			pos, err := kafka.DecodeOffsets(e)
			if err != nil {
				return nil
			}
			for _, p := range pos {
				out = append(out, inspectedOffset{Topic: p.Topic, Partition: p.Partition, Offset: p.Offset, Subtask: op.Subtask})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Partition < out[j].Partition
	})
	return out
}

type inspectedSubtask struct {
	Subtask int `json:"subtask"`
	// KeyGroups is the subtask's key-group range "first-last" at the
	// snapshot's parallelism, KeyGroupCount its size, KeyGroupsWithState
	// how many of them hold state.
	KeyGroups          string `json:"key_groups,omitempty"`
	KeyGroupCount      int    `json:"key_group_count,omitempty"`
	KeyGroupsWithState int    `json:"key_groups_with_state,omitempty"`
	// OperatorStateEntries and OperatorStateBytes are its non-keyed state.
	OperatorStateEntries int   `json:"operator_state_entries,omitempty"`
	OperatorStateBytes   int64 `json:"operator_state_bytes,omitempty"`
	KeyedStateBytes      int64 `json:"keyed_state_bytes,omitempty"`
	// Watermark is the last watermark a source subtask sent before the
	// barrier: where it resumes after a restore.
	Watermark *int64 `json:"watermark,omitempty"`
}

type inspectedState struct {
	Name    string `json:"name"`
	Bytes   int64  `json:"bytes"`
	Entries int64  `json:"entries"`
}

// inspect describes s; broadcast says which operators keep broadcast state
// (nil: none known).
func inspect(s snapshot, broadcast func(uid string) bool) inspection {
	out := inspection{Kind: s.Kind, Path: s.Path, Job: s.C.Job, JobType: s.JobType, JobParams: s.Params,
		Checkpoint: uint64(s.C.ID), Time: s.C.CompletedAt.UTC(), FormatVersion: s.Version, Bytes: s.C.Size()}
	by, uids := s.operators()
	for _, uid := range uids {
		ops := by[uid]
		o := inspectedOp{UID: uid, Parallelism: ops[0].Parallelism, MaxParallelism: ops[0].MaxParallelism}
		states := map[string]*inspectedState{}
		var order []string
		for _, op := range ops {
			st := inspectedSubtask{Subtask: op.Subtask, OperatorStateEntries: len(op.State), KeyGroupsWithState: len(op.KeyGroups), Watermark: op.Watermark}
			for _, e := range op.State {
				st.OperatorStateBytes += int64(len(e))
			}
			if op.MaxParallelism > 0 && op.Parallelism > 0 {
				kgs := runtime.KeyGroupRange(op.Subtask, op.MaxParallelism, op.Parallelism)
				if len(kgs) > 0 {
					st.KeyGroups = fmt.Sprintf("%d-%d", kgs[0], kgs[len(kgs)-1])
					st.KeyGroupCount = len(kgs)
				}
			}
			kgs := make([]int, 0, len(op.KeyGroups))
			for kg := range op.KeyGroups {
				kgs = append(kgs, kg)
			}
			slices.Sort(kgs)
			for _, kg := range kgs {
				blob := op.KeyGroups[kg]
				st.KeyedStateBytes += int64(len(blob))
				parts, err := runtime.SplitKeyGroup(blob)
				if err != nil && o.StateError == "" {
					o.StateError = fmt.Sprintf("subtask %d key group %d: %v", op.Subtask, kg, err)
				}
				for _, p := range parts {
					is := states[p.Name]
					if is == nil {
						is = &inspectedState{Name: p.Name}
						states[p.Name] = is
						order = append(order, p.Name)
					}
					is.Bytes += int64(p.Bytes)
					is.Entries += int64(p.Entries)
				}
			}
			o.Subtasks = append(o.Subtasks, st)
			o.Handles = append(o.Handles, op.Handles...)
		}
		sort.Strings(order)
		for _, n := range order {
			o.States = append(o.States, *states[n])
		}
		if broadcast != nil && broadcast(uid) {
			parts, err := runtime.SplitBroadcastState(ops[0].State)
			if err != nil {
				o.BroadcastError = fmt.Sprintf("subtask %d: %v", ops[0].Subtask, err)
			}
			for _, p := range parts {
				o.BroadcastStates = append(o.BroadcastStates, inspectedState{Name: p.Name, Bytes: int64(p.Bytes), Entries: int64(p.Entries)})
			}
		} else {
			o.Offsets = partitionOffsets(ops)
		}
		out.Operators = append(out.Operators, o)
	}
	return out
}

func newSavepointInspectCmd(a *app) *cobra.Command {
	var (
		f      snapshotFlags
		output string
	)
	cmd := &cobra.Command{
		Use:   "inspect PATH [--output table|json] [--job-id ID] [--checkpoint N]",
		Short: "Describe a savepoint or a retained checkpoint: operators, key groups, state sizes, source watermarks, pending transactions",
		Long: `inspect reads a savepoint or a retained checkpoint and describes it: the job
(and its type and parameters when recorded), the checkpoint id and time, the
savepoint format version, and per operator UID its parallelism, max
parallelism, each subtask's key-group range, the size in bytes and number of
entries of each keyed state name, its operator state, the size and number of
entries of each broadcast state name (in one subtask's copy: every subtask
holds the same; known when the job's type is recorded and registered here),
and its pending
transaction handles (transactional id, producer id and epoch, partitions); for
a Kafka partition source (sources/kafka), each partition's offset: the next
record a job restored from it reads.
Every byte is verified: a damaged or truncated savepoint fails with one error
naming the file.

` + snapshotPathHelp,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "table" && output != "json" {
				return flagError(cmd, fmt.Errorf("invalid --output %q: want table or json", output))
			}
			s, err := loadSnapshot(cmd.Context(), args[0], f)
			if err != nil {
				return err
			}
			in := inspect(s, a.broadcastOperators(s))
			if output == "json" {
				return printJSON(a.stdout, in)
			}
			return printInspection(a.stdout, in)
		},
	}
	f.add(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table|json")
	return cmd
}

// broadcastOperators says which operators of s keep broadcast state, from
// the graph of its recorded job type; nil when the type is not recorded or
// does not build here (inspection then shows operator state as bytes only).
func (a *app) broadcastOperators(s snapshot) func(uid string) bool {
	if s.JobType == "" {
		return nil
	}
	job, err := a.reg.Build(s.JobType, s.Params)
	if err != nil {
		return nil
	}
	return job.HasBroadcastState
}

// printStates prints the states of one kind (what), by name, and why they
// could not be split, if they could not.
func printStates(tw io.Writer, what string, states []inspectedState, splitErr string) {
	if len(states) > 0 {
		fmt.Fprintf(tw, "  %s\tBYTES\tENTRIES\n", strings.ToUpper(what))
		for _, s := range states {
			fmt.Fprintf(tw, "  %s\t%d\t%d\n", s.Name, s.Bytes, s.Entries)
		}
	}
	if splitErr != "" {
		fmt.Fprintf(tw, "  %s not readable by name: %s\n", what, splitErr)
	}
}

func printInspection(w io.Writer, in inspection) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\t%s\n", strings.ToUpper(in.Kind[:1])+in.Kind[1:], in.Path)
	fmt.Fprintf(tw, "Job\t%s\n", in.Job)
	if in.JobType != "" {
		keys := make([]string, 0, len(in.JobParams))
		for k := range in.JobParams {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		ps := make([]string, 0, len(keys))
		for _, k := range keys {
			ps = append(ps, k+"="+in.JobParams[k])
		}
		fmt.Fprintf(tw, "Job type\t%s %s\n", in.JobType, strings.Join(ps, " "))
	} else {
		fmt.Fprintf(tw, "Job type\t(not recorded)\n")
	}
	fmt.Fprintf(tw, "Checkpoint\t%d\n", in.Checkpoint)
	fmt.Fprintf(tw, "Time\t%s\n", in.Time.Format(time.RFC3339Nano))
	if in.FormatVersion > 0 {
		fmt.Fprintf(tw, "Format version\t%d\n", in.FormatVersion)
	}
	fmt.Fprintf(tw, "State bytes\t%d\n", in.Bytes)
	for _, o := range in.Operators {
		fmt.Fprintf(tw, "\nOperator %s\tparallelism %d, max parallelism %d\n", o.UID, o.Parallelism, o.MaxParallelism)
		fmt.Fprintf(tw, "  SUBTASK\tKEY GROUPS\tWITH STATE\tKEYED BYTES\tOPERATOR STATE\n")
		for _, st := range o.Subtasks {
			kgs := "-"
			if st.KeyGroups != "" {
				kgs = fmt.Sprintf("%s (%d)", st.KeyGroups, st.KeyGroupCount)
			}
			fmt.Fprintf(tw, "  %d\t%s\t%d\t%d\t%d entries, %d bytes\n", st.Subtask, kgs, st.KeyGroupsWithState, st.KeyedStateBytes,
				st.OperatorStateEntries, st.OperatorStateBytes)
		}
		for _, st := range o.Subtasks {
			if st.Watermark != nil {
				fmt.Fprintf(tw, "  watermark\tsubtask %d\t%d\n", st.Subtask, *st.Watermark)
			}
		}
		printStates(tw, "state", o.States, o.StateError)
		printStates(tw, "broadcast state", o.BroadcastStates, o.BroadcastError)
		if len(o.Offsets) > 0 {
			fmt.Fprintf(tw, "  PARTITION\tOFFSET\tSUBTASK\n")
			for _, p := range o.Offsets {
				fmt.Fprintf(tw, "  %s/%d\t%d\t%d\n", p.Topic, p.Partition, p.Offset, p.Subtask)
			}
		}
		for _, h := range o.Handles {
			parts := make([]string, 0, len(h.Partitions))
			for _, p := range h.Partitions {
				parts = append(parts, fmt.Sprintf("%s/%d@%d", p.Topic, p.Partition, p.FirstOffset))
			}
			fmt.Fprintf(tw, "  pending transaction\t%s\tproducer %d epoch %d\tcheckpoint %d\t%s\n", h.TransactionalID, h.ProducerID, h.Epoch,
				h.Checkpoint, strings.Join(parts, " "))
		}
	}
	return tw.Flush()
}
