package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/runtime"
)

// registry holds every job type this binary can run: each node of a cluster
// runs the same binary and builds jobs from (name, parameters).
func registry() (*runtime.Registry, error) {
	r := runtime.NewRegistry()
	if err := wordcount.Register(r); err != nil {
		return nil, err
	}
	return r, nil
}

func newJobsCmd(a *app) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "jobs",
		Short: "List the registered job types and their parameters",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			r, err := registry()
			if err != nil {
				return err
			}
			switch output {
			case "json":
				type param struct{ Name, Default, Description string }
				type job struct {
					Name, Description string
					Params            []param
				}
				var out []job
				for _, t := range r.Types() {
					j := job{Name: t.Name, Description: t.Description}
					for _, p := range t.Params {
						j.Params = append(j.Params, param(p))
					}
					out = append(out, j)
				}
				enc := json.NewEncoder(a.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			case "table":
				tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
				for _, t := range r.Types() {
					fmt.Fprintf(tw, "%s\t%s\n", t.Name, t.Description)
					for _, p := range t.Params {
						fmt.Fprintf(tw, "  --set %s=\t(default %q)\t%s\n", p.Name, p.Default, p.Description)
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
