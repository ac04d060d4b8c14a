// Package cli is streamctl, Weir's command-line interface, as a library: the
// cobra commands (broker, demo, jobs, bench, version, ...) and their shared
// output handling (logs on stderr, results on stdout, the progress line).
// Main gives a program's own main the whole CLI with the job types of its
// registry, so a binary with user-defined job types is deployed exactly as
// streamctl is; cmd/streamctl is that main with the built-in job types.
//
// Each command is one file (xxx.go with newXxxCmd) and the root adds them
// (subcommands in root.go). A command wires packages together: it must hold
// no logic a test of another package would need (that lives in the package
// it calls), and it must not write to os.Stdout or os.Stderr directly (only
// Main does, through the app's writers). Nothing but cmd/... and
// examples/... imports cli.
package cli
