// Command streamctl is Weir's command-line interface: the embedded broker,
// the end-to-end demo, the benchmarks and the list of registered job types.
// The commands live in package cli; this main only registers the built-in
// job types (wordcount, uppercase, sessions, nexmark) and calls cli.Main. A program with job types of its
// own does the same with its own registry.
//
// It wires packages together and must hold no logic a test of another
// package would need.
package main

import (
	"fmt"
	"os"

	"github.com/weirstream/weir/cli"
	"github.com/weirstream/weir/examples/nexmark"
	"github.com/weirstream/weir/examples/sessions"
	"github.com/weirstream/weir/examples/uppercase"
	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/runtime"
)

func main() {
	reg := runtime.NewRegistry()
	for _, register := range []func(*runtime.Registry) error{wordcount.Register, uppercase.Register, sessions.Register, nexmark.Register} {
		if err := register(reg); err != nil {
			fmt.Fprintln(os.Stderr, "Error:", err)
			os.Exit(1)
		}
	}
	cli.Main(reg)
}
