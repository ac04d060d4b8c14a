package cli

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/weirstream/weir/runtime"
)

// newStateCmd is the state command with its dump subcommand.
func newStateCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "state",
		Short: "Read the keyed state of a savepoint or a retained checkpoint (dump)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newStateDumpCmd(a))
	return cmd
}

func newStateDumpCmd(a *app) *cobra.Command {
	var (
		f        snapshotFlags
		operator string
		state    string
		jobType  string
		sets     []string
	)
	cmd := &cobra.Command{
		Use:   "dump PATH --operator UID [--state NAME] [--job TYPE] [--set key=value]...",
		Short: "Print an operator's keyed and broadcast state as JSON lines, decoded through its codecs",
		Long: `dump prints the keyed state of the operator UID in a savepoint or a retained
checkpoint as JSON lines, one per entry, key group by key group:

  {"key_group":3,"state":"count","key":"fox","value":12}

A map state gives one line per map entry ("map_key"); a window operator's
contents (state "window-contents") one line per key and window, the window in
"namespace" ({"start":..,"end":..}) and its accumulator in "value"; timers
(state "timers", or "timers/NAME" for NewTimers) one line per timer with
"timer":{"domain":"event-time"|"processing-time","timestamp":ms} and its
namespace, if any.

An operator with broadcast state (ProcessBroadcast, ProcessKeyedBroadcast)
first gets one line per entry of each broadcast state, state by state in
name order, entries in the order of their encoded keys:

  {"broadcast_state":"rules","key":"fox","value":3}

Every subtask checkpoints the same copy of it; the first subtask's is
printed. Broadcast state is known only through the job's graph (below).

Keys and values are decoded through the codecs the operator declares, as
Flink's State Processor API reads state: the job's graph is built again from
its registered type and parameters (recorded in savepoints written with them,
and in a job manager's job store; --job TYPE and --set key=value give or
override them) and the operator's function opened, without running. An
entry whose codec cannot be found (no job type known, a state the operator no
longer declares, bytes the codec refuses) is printed with its key and value
as base64 ("key_base64", "value_base64") and "undecoded" saying why; it is
never an error that hides the rest. --state NAME prints that state only.

` + snapshotPathHelp,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if operator == "" {
				return flagError(cmd, errors.New("--operator UID is required"))
			}
			overrides, err := parseSets(sets)
			if err != nil {
				return flagError(cmd, err)
			}
			s, err := loadSnapshot(cmd.Context(), args[0], f)
			if err != nil {
				return err
			}
			by, uids := s.operators()
			ops, ok := by[operator]
			if !ok {
				return fmt.Errorf("no operator %q in %s %s: its operators are %s", operator, s.Kind, s.Path, strings.Join(uids, ", "))
			}
			kgs := map[int][]byte{}
			for _, op := range ops {
				maps.Copy(kgs, op.KeyGroups)
			}
			job, err := a.dumpJob(s, operator, jobType, overrides)
			if err != nil {
				return err
			}
			w := bufio.NewWriter(a.stdout)
			enc := json.NewEncoder(w)
			enc.SetEscapeHTML(false)
			lines := 0
			// encode prints one line; a decoded value JSON cannot hold (a
			// NaN, say) is printed as text, with the reason.
			encode := func(r any, value *any, undecoded *string) error {
				lines++
				if err := enc.Encode(r); err != nil {
					*value, *undecoded = fmt.Sprintf("%v", *value), fmt.Sprintf("json: %v", err)
					return enc.Encode(r)
				}
				return nil
			}
			broadcast := job != nil && job.HasBroadcastState(operator)
			if broadcast {
				// Every subtask checkpoints the same copy: the first
				// subtask's is read, as Flink's State Processor API reads
				// one.
				err = runtime.ReadBroadcastState(cmd.Context(), job, operator, ops[0].State, func(r runtime.BroadcastRecord) error {
					if state != "" && r.State != state {
						return nil
					}
					return encode(&r, &r.Value, &r.Undecoded)
				})
			} else if job == nil && len(ops[0].State) > 0 {
				fmt.Fprintf(a.stderr, "note: without a job graph the operator state of %q (broadcast state, if it is) is not printed\n", operator)
			}
			if err == nil {
				err = runtime.ReadKeyedState(cmd.Context(), job, operator, kgs, func(r runtime.StateRecord) error {
					if state != "" && r.State != state {
						return nil
					}
					return encode(&r, &r.Value, &r.Undecoded)
				})
				if broadcast && errors.Is(err, runtime.ErrNotKeyed) {
					err = nil // broadcast state alone (ProcessBroadcast)
				}
			}
			if ferr := w.Flush(); err == nil {
				err = ferr
			}
			if err != nil {
				return fmt.Errorf("%s %s: operator %q: %w", s.Kind, s.Path, operator, err)
			}
			if state != "" && lines == 0 {
				fmt.Fprintf(a.stderr, "no entries of state %q in operator %q\n", state, operator)
			}
			return nil
		},
	}
	f.add(cmd)
	cmd.Flags().StringVar(&operator, "operator", "", "UID of the operator whose keyed state to print (required)")
	cmd.Flags().StringVar(&state, "state", "", "print only this state (as named in the output, e.g. count, window-contents, timers, or a broadcast state's name)")
	cmd.Flags().StringVar(&jobType, "job", "", "registered job type to take codecs from (default: the type recorded with the snapshot)")
	cmd.Flags().StringArrayVar(&sets, "set", nil, "job parameter key=value (repeatable), over those recorded")
	return cmd
}

// dumpJob builds the graph of the snapshot's job to take codecs from: the
// type given (--job) or recorded, its recorded parameters overridden by
// --set. It returns nil, after a note on stderr, when no type is known, or
// the recorded one is not registered here or has no operator uid: the
// state is then dumped as bytes. A --job that does not build is an error.
func (a *app) dumpJob(s snapshot, uid, jobType string, overrides map[string]string) (*runtime.Job, error) {
	given := jobType != ""
	params := map[string]string{}
	if !given || jobType == s.JobType {
		maps.Copy(params, s.Params)
	}
	maps.Copy(params, overrides)
	if !given {
		jobType = s.JobType
	}
	if jobType == "" {
		fmt.Fprintf(a.stderr, "note: %s %s records no job type: keys and values are printed as base64; give --job TYPE [--set key=value]... to decode them\n", s.Kind, s.Path)
		return nil, nil
	}
	job, err := a.reg.Build(jobType, params)
	if err != nil && given {
		return nil, fmt.Errorf("--job %s: %w", jobType, err)
	}
	if err != nil {
		fmt.Fprintf(a.stderr, "note: cannot build the recorded job type %q (%v): keys and values are printed as base64; give --job TYPE [--set key=value]...\n", jobType, err)
		return nil, nil
	}
	if !slices.Contains(job.OperatorUIDs(), uid) {
		fmt.Fprintf(a.stderr, "note: job type %q has no operator %q (its operators are %s): keys and values are printed as base64\n", jobType, uid, strings.Join(job.OperatorUIDs(), ", "))
		return nil, nil
	}
	return job, nil
}
