package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func newVersionCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print streamctl's module version, VCS revision and Go version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprint(a.stdout, versionText())
			return err
		},
	}
}

// versionText renders the build information of the running binary.
func versionText() string {
	module, version := "github.com/weirstream/weir", "unknown"
	var revision, modified string
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Path != "" {
			module = bi.Main.Path
		}
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
	}
	out := fmt.Sprintf("streamctl %s\nmodule: %s\ngo: %s %s/%s\n", version, module, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if revision != "" {
		if modified == "true" {
			revision += " (modified)"
		}
		out += "revision: " + revision + "\n"
	}
	return out
}
