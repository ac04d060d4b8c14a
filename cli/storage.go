package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/internal/s3server"
	"github.com/weirstream/weir/jobmanager"
	"github.com/weirstream/weir/runtime"
)

// storageFlags are the checkpoint storage flags (docs/internals/
// checkpoint-storage.md) of the commands that run a job master: where task
// state goes, what stays inline, and the orphan sweep's grace period.
type storageFlags struct {
	url    string
	inline int64
	grace  time.Duration
	// embedded allows --checkpoint-storage embedded (local only).
	embedded bool
}

// embeddedStorage is the --checkpoint-storage value that starts the
// embedded S3 server.
const embeddedStorage = "embedded"

func (f *storageFlags) add(cmd *cobra.Command, embedded bool) {
	f.embedded = embedded
	help := "URL of the checkpoint storage task state is written to: file:///DIR, s3://BUCKET/PREFIX?endpoint=URL&region=R (credentials the standard AWS way) or mem:// (default: none, state inline in the checkpoint store)"
	if embedded {
		help = "URL of the checkpoint storage task state is written to: file:///DIR, s3://BUCKET/PREFIX?endpoint=URL&region=R (credentials the standard AWS way), or \"embedded\": an in-process S3 server whose objects die with the process (default: none, state inline in the checkpoint store)"
	}
	cmd.Flags().StringVar(&f.url, "checkpoint-storage", "", help)
	cmd.Flags().Int64Var(&f.inline, "state-inline-limit", checkpoint.DefaultInlineLimit,
		"with --checkpoint-storage: a task snapshot smaller than this many bytes stays inline (-1: none)")
	cmd.Flags().DurationVar(&f.grace, "checkpoint-orphan-grace", runtime.DefaultOrphanGrace,
		"with --checkpoint-storage: how old an object no retained checkpoint references must be before the orphan sweep deletes it")
}

// check refuses values that cannot work.
func (f *storageFlags) check(cmd *cobra.Command) error {
	if f.grace < 0 {
		return flagError(cmd, fmt.Errorf("--checkpoint-orphan-grace %v must not be negative", f.grace))
	}
	if f.inline < -1 {
		return flagError(cmd, fmt.Errorf("--state-inline-limit %d: want -1 (none) or a size in bytes", f.inline))
	}
	if f.url == embeddedStorage && !f.embedded {
		return flagError(cmd, errors.New(`--checkpoint-storage embedded is for "streamctl local"; give a storage URL`))
	}
	return nil
}

// inlineLimit is the limit as runtime takes it (negative: none).
func (f *storageFlags) inlineLimit() int64 {
	if f.inline == 0 {
		return -1 // nothing is smaller than 0 bytes: everything goes to storage
	}
	return f.inline
}

// resolve returns the storage URL to use and the options to open it with,
// starting the embedded S3 server for "embedded" (stop closes it).
func (f *storageFlags) resolve(ctx context.Context) (rawURL string, opts []storage.Opt, stop func(), err error) {
	if f.url != embeddedStorage {
		return f.url, nil, func() {}, nil
	}
	srv, err := s3server.Start(ctx, s3server.Buckets("weir"))
	if err != nil {
		return "", nil, nil, err
	}
	return srv.URL("weir", "checkpoints"), []storage.Opt{storage.Credentials("weir", "weir")}, func() { _ = srv.Close() }, nil
}

// jmStorage is the checkpoint storage a job manager runs with.
type jmStorage struct {
	url    string
	opts   []storage.Opt
	inline int64
	grace  time.Duration
}

// jobManagerOpts are the job manager's options for it.
func (s jmStorage) jobManagerOpts() []jobmanager.Opt {
	if s.url == "" {
		return nil
	}
	return []jobmanager.Opt{jobmanager.CheckpointStorage(s.url, s.opts...), jobmanager.StateInlineLimit(s.inline), jobmanager.OrphanGrace(s.grace)}
}

// jobManager resolves the flags into a job manager's storage (stop ends
// an embedded S3 server).
func (f *storageFlags) jobManager(ctx context.Context) (jmStorage, func(), error) {
	u, opts, stop, err := f.resolve(ctx)
	if err != nil {
		return jmStorage{}, nil, err
	}
	return jmStorage{url: u, opts: opts, inline: f.inlineLimit(), grace: f.grace}, stop, nil
}
