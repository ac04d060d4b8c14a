package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/runtime"
)

// Main runs streamctl with the job types of reg and exits: the whole CLI
// (broker, demo, jobs, bench, version, ...) for a program's own main, so a
// binary built with a user's job types registered next to (or instead of)
// wordcount runs them. Arguments come from os.Args, output goes to
// os.Stdout and os.Stderr; SIGINT and SIGTERM cancel the running command
// (a second signal kills the process). It exits 1 when the command fails
// (the error is printed on stderr), 0 otherwise. A nil reg is an empty
// registry.
func Main(reg *runtime.Registry) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal, restore the default behaviour so a second
	// SIGINT kills a command whose clean stop hangs.
	go func() {
		<-ctx.Done()
		stop()
	}()
	err := Run(ctx, reg, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		// cobra has printed the error.
		os.Exit(1)
	}
}

// Run runs streamctl once in-process with args (without the program name),
// the job types of reg (nil: none), results written to stdout and logs and
// errors to stderr. Cancelling ctx stops a long-running command cleanly.
// It returns the command's error, which has already been printed to stderr.
func Run(ctx context.Context, reg *runtime.Registry, args []string, stdout, stderr io.Writer) error {
	root := newRootCmd(reg, stdout, stderr)
	root.SetArgs(args)
	return root.ExecuteContext(ctx)
}

// subcommands returns the constructors of streamctl's subcommands, in help
// order. To add a command, write `func newXxxCmd(a *app) *cobra.Command` in
// its own file (xxx.go) and add it here: that line is the only change this
// file needs.
func subcommands() []func(*app) *cobra.Command {
	return []func(*app) *cobra.Command{
		newBrokerCmd,
		newBenchCmd,
		newBenchTaskManagerCmd,
		newBenchNexmarkRunCmd,
		newCancelCmd,
		newCheckpointsCmd,
		newDemoCmd,
		newJobsCmd,
		newJobManagerCmd,
		newListCmd,
		newLocalCmd,
		newNexmarkCmd,
		newRunCmd,
		newSavepointCmd,
		newStateCmd,
		newStatusCmd,
		newStopCmd,
		newSubmitCmd,
		newTaskManagerCmd,
		newVersionCmd,
	}
}

// app is what every command shares: the registered job types, the global
// flags and the output streams. Commands write results to stdout and logs and diagnostics to
// stderr (through logger), never to os.Stdout directly, so tests can run
// them in-process.
type app struct {
	reg    *runtime.Registry
	stdout io.Writer
	stderr io.Writer

	logLevel  string
	logFormat string

	// sink is stderr as logs and the progress line share it
	// (stderrSink), made on first use.
	sink *progressLine
}

// newRootCmd builds the streamctl command tree for the job types of reg
// (nil: none), writing to stdout and stderr.
func newRootCmd(reg *runtime.Registry, stdout, stderr io.Writer) *cobra.Command {
	if reg == nil {
		reg = runtime.NewRegistry()
	}
	a := &app{reg: reg, stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "streamctl",
		Short: "Weir: exactly-once stream processing from Kafka share groups to Kafka topics",
		Long: `streamctl runs Weir: the embedded Kafka broker, a cluster (a job manager and
task managers, as separate processes or all in one with "local"), submits
registered jobs to it and follows them (submit, list, status, cancel,
checkpoints), runs a job in one process (run), and runs the end-to-end
exactly-once demo and the benchmarks.

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
	//lint:ignore ST1005 the hint is the last line a user reads, as a sentence
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
// withLogger is a command's RunE that builds the logger from the global
// flags, runs fn with it and syncs it after: the one way commands get
// their logger.
func (a *app) withLogger(fn func(cmd *cobra.Command, log *zap.Logger) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		log, err := a.logger()
		if err != nil {
			return err
		}
		defer func() { _ = log.Sync() }()
		if a.logFormat == "json" {
			restore, err := redirectStdLog(log)
			if err != nil {
				return err
			}
			defer restore()
		}
		return fn(cmd, log)
	}
}

// redirectStdLog sends what the standard library's log package writes
// (net/http's "http: TLS handshake error ...", for one) through log as
// warnings with component=stdlog, so that --log-format json writes only
// JSON lines. The log package's output is process-wide state: it stays
// redirected until restore is called, and two commands run at once in
// one process with --log-format json share it (the last one redirected
// wins until it restores). gRPC's logger needs nothing: it discards
// everything unless GRPC_GO_LOG_SEVERITY_LEVEL is set.
func redirectStdLog(log *zap.Logger) (restore func(), err error) {
	restore, err = zap.RedirectStdLogAt(log.With(zap.String("component", "stdlog")), zapcore.WarnLevel)
	if err != nil {
		return nil, fmt.Errorf("redirect the standard library's log: %w", err)
	}
	return restore, nil
}

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
