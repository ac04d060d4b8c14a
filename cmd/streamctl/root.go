package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/weirstream/weir/internal/failpoint"
)

// subcommands returns the constructors of streamctl's subcommands, in help
// order. To add a command, write `func newXxxCmd(a *app) *cobra.Command` in
// its own file (xxx.go) and add it here: that line is the only change this
// file needs.
func subcommands() []func(*app) *cobra.Command {
	return []func(*app) *cobra.Command{
		newBrokerCmd,
		newBenchCmd,
		newDemoCmd,
		newJobsCmd,
		newVersionCmd,
	}
}

// app is what every command shares: the global flags and the output
// streams. Commands write results to stdout and logs and diagnostics to
// stderr (through logger), never to os.Stdout directly, so tests can run
// them in-process.
type app struct {
	stdout io.Writer
	stderr io.Writer

	logLevel  string
	logFormat string

	// sink is stderr as logs and the progress line share it
	// (stderrSink), made on first use.
	sink *progressLine
}

// newRootCmd builds the streamctl command tree writing to stdout and stderr.
func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	a := &app{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "streamctl",
		Short: "Weir: exactly-once stream processing from Kafka share groups to Kafka topics",
		Long: `streamctl runs Weir's embedded Kafka broker, the end-to-end exactly-once demo
and the benchmarks, and lists the registered job types. Jobs run on the
in-process mini cluster today; the job manager, task managers and job
submission are not built yet.

Logs go to stderr; results go to stdout. WEIR_FAILPOINTS in the environment
injects faults (see the README); a bad spec is refused before any command runs.`,
		// A failing command prints its error once, without the usage
		// text; flag errors add a pointer to --help (flagError).
		SilenceUsage: true,
		// Validate the global flags and WEIR_FAILPOINTS before any
		// command runs. A subcommand that defines its own
		// PersistentPreRunE must call a.validate itself (cobra runs
		// only the nearest hook).
		PersistentPreRunE: func(*cobra.Command, []string) error { return a.validate() },
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(flagError)

	pf := root.PersistentFlags()
	pf.StringVar(&a.logLevel, "log-level", "info", "log level: debug|info|warn|error")
	pf.StringVar(&a.logFormat, "log-format", "console", "log format: console|json")

	for _, newCmd := range subcommands() {
		root.AddCommand(newCmd(a))
	}
	return root
}

// flagError adds a pointer to the command's help to a flag parsing error.
func flagError(cmd *cobra.Command, err error) error {
	return fmt.Errorf("%w\nRun '%s --help' for usage.", err, cmd.CommandPath())
}

// validate checks the global flags and the failpoints in the environment
// (every weir process reads WEIR_FAILPOINTS; a typo must not run silently
// without its fault).
func (a *app) validate() error {
	if _, err := a.level(); err != nil {
		return err
	}
	if _, err := failpoint.FromEnv(); err != nil {
		return err
	}
	switch a.logFormat {
	case "console", "json":
		return nil
	}
	return fmt.Errorf("invalid --log-format %q: want console or json", a.logFormat)
}

func (a *app) level() (zapcore.Level, error) {
	switch strings.ToLower(a.logLevel) {
	case "debug":
		return zapcore.DebugLevel, nil
	case "info":
		return zapcore.InfoLevel, nil
	case "warn":
		return zapcore.WarnLevel, nil
	case "error":
		return zapcore.ErrorLevel, nil
	}
	return 0, fmt.Errorf("invalid --log-level %q: want debug, info, warn or error", a.logLevel)
}

// logger builds the zap logger the global flags ask for, writing to stderr.
// Call it once per command run; Sync it before returning.
func (a *app) logger() (*zap.Logger, error) {
	if err := a.validate(); err != nil {
		return nil, err
	}
	lvl, _ := a.level()
	core := zapcore.NewCore(newEncoder(a.logFormat), a.stderrSink(), lvl)
	return zap.New(newCLICore(core), zap.ErrorOutput(zapcore.Lock(zapcore.AddSync(a.stderr)))), nil
}

// newEncoder returns the encoder of a --log-format: JSON (one object per
// line) or console, both with ISO 8601 timestamps.
func newEncoder(format string) zapcore.Encoder {
	if format == "json" {
		ec := zap.NewProductionEncoderConfig()
		ec.EncodeTime = zapcore.ISO8601TimeEncoder
		return zapcore.NewJSONEncoder(ec)
	}
	ec := zap.NewDevelopmentEncoderConfig()
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	return zapcore.NewConsoleEncoder(ec)
}
