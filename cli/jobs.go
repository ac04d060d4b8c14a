package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/weirstream/weir/runtime"
)

// jobParam is one parameter of a job type as `jobs` shows it.
type jobParam struct {
	Name        string `json:"name"`
	Default     string `json:"default"`
	Description string `json:"description"`
	// Reserved parameters are understood by every job type without being
	// declared by it (runtime.ParamParallelism).
	Reserved bool `json:"reserved"`
}

// jobType is a registered job type as `jobs` shows it.
type jobType struct {
	Name        string     `json:"name"`
	Description string     `json:"description"`
	Params      []jobParam `json:"params"`
}

// jobTypes lists r's job types with their declared parameters followed by
// the reserved ones every job type takes.
func jobTypes(r *runtime.Registry) []jobType {
	out := []jobType{}
	for _, t := range r.Types() {
		j := jobType{Name: t.Name, Description: t.Description, Params: []jobParam{}}
		declared := map[string]bool{}
		for _, p := range t.Params {
			declared[p.Name] = true
			j.Params = append(j.Params, jobParam{Name: p.Name, Default: p.Default, Description: p.Description})
		}
		if !declared[runtime.ParamParallelism] {
			j.Params = append(j.Params, jobParam{Name: runtime.ParamParallelism, Default: "1",
				Description: "default parallelism of the job's operators", Reserved: true})
		}
		if !declared[runtime.ParamStateBackend] {
			j.Params = append(j.Params, jobParam{Name: runtime.ParamStateBackend, Default: string(runtime.HeapState),
				Description: `where the job's keyed state lives: "heap" or "pebble"`, Reserved: true})
		}
		out = append(out, j)
	}
	return out
}

func newJobsCmd(a *app) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "jobs [--output table|json]",
		Short: "List the registered job types and their parameters",
		Long: `jobs lists the job types this binary has registered, with their parameters
(name, default, meaning). "parallelism" and "state-backend" are reserved: every
job type takes them.

Parameters are key=value strings; a job type refuses parameters it does not
declare. "streamctl run JOB" runs one in this process, "streamctl submit JOB" on a
cluster.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			types := jobTypes(a.reg)
			switch output {
			case "json":
				return printJSON(a.stdout, types)
			case "table":
				tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
				for i, t := range types {
					if i > 0 {
						fmt.Fprintln(tw)
					}
					fmt.Fprintf(tw, "%s\t%s\n", t.Name, t.Description)
					fmt.Fprintf(tw, "  PARAMETER\tDEFAULT\tDESCRIPTION\n")
					for _, p := range t.Params {
						desc := p.Description
						if p.Reserved {
							desc += " (reserved: every job type)"
						}
						fmt.Fprintf(tw, "  %s\t%s\t%s\n", p.Name, p.Default, desc)
					}
				}
				return tw.Flush()
			}
			return fmt.Errorf("invalid --output %q: want table or json", output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table|json")
	return cmd
}
