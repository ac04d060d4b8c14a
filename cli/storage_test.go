package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/examples/nexmark"
	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/proctest"
	"github.com/weirstream/weir/internal/s3server"
	weirruntime "github.com/weirstream/weir/runtime"
)

// local --checkpoint-storage embedded: the wordcount's task state goes to
// the in-process S3 server (nothing stays inline with
// --state-inline-limit 0), every word is counted exactly once, and the
// checkpoints' state is there, by reference.
func TestLocalWithEmbeddedCheckpointStorageWritesTaskStateThere(t *testing.T) {
	c := startLocal(t, "--taskmanagers", "2", "--slots", "2", "--checkpoint-storage", "embedded", "--state-inline-limit", "0")
	m := regexp.MustCompile(`(?m)^checkpoint storage (s3://\S+)$`).FindStringSubmatch(c.out.String())
	if m == nil {
		t.Fatalf("local did not print its checkpoint storage: %q", c.out.String())
	}
	lines := testLines(400, "s")
	produceLines(t, c.broker, "lines", lines)
	id := c.submitWordcount(t, "200ms")
	waitCounted(t, c.broker, "counts", wordcount.Expected(lines))
	st, err := storage.Open(t.Context(), m[1], storage.Credentials("weir", "weir"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		n := 0
		if err := st.List(t.Context(), checkpoint.SharedPrefix(id), func(storage.Object) error { n++; return nil }); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no object under %s in the embedded checkpoint storage", checkpoint.SharedPrefix(id))
		}
	}
	if _, err := c.cli(t, "cancel", id); err != nil {
		t.Fatal(err)
	}
	// A job cancelled without --retain-on-cancel leaves no checkpoint
	// behind (Flink discards a cancelled job's checkpoints): neither in the
	// checkpoint store nor in the checkpoint storage; status still says
	// which checkpoint it completed last.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var left []string
		if err := st.List(t.Context(), id+"/", func(o storage.Object) error { left = append(left, o.Key); return nil }); err != nil {
			t.Fatal(err)
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cancelled job left %d objects, e.g. %s", len(left), left[0])
		}
	}
	if out, err := c.cli(t, "checkpoints", id, "--output", "json"); err != nil || strings.TrimSpace(out) != "[]" {
		t.Fatalf("checkpoints of the cancelled job: %q, %v; want none", out, err)
	}
	if got := c.status(t, id); got.State != "CANCELED" || got.LastCompletedCheckpoint == 0 {
		t.Fatalf("status after the cancel: %+v, want CANCELED with its last completed checkpoint", got)
	}
}

func TestStorageFlagsRefuseWhatCannotWork(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"jobmanager", "--checkpoint-storage", "embedded"}, `--checkpoint-storage embedded is for "streamctl local"`},
		{[]string{"jobmanager", "--checkpoint-storage", "ftp://x"}, "unknown scheme"},
		{[]string{"jobmanager", "--checkpoint-orphan-grace", "-1s"}, "must not be negative"},
		{[]string{"jobmanager", "--checkpoint-timeout", "0s"}, "--checkpoint-timeout 0s must be positive"},
		{[]string{"run", "wordcount", "--state-inline-limit", "-2"}, "--state-inline-limit -2"},
	} {
		var out, errs bytes.Buffer
		root := newRootCmd(testRegistry(t), &out, &errs)
		root.SetArgs(tc.args)
		err := root.ExecuteContext(t.Context())
		if err == nil || !regexp.MustCompile(regexp.QuoteMeta(tc.want)).MatchString(err.Error()) {
			t.Errorf("%v: error %v, want one saying %q", tc.args, err, tc.want)
		}
	}
}

// A retained checkpoint whose task state is in checkpoint storage: inspect
// says which flag it needs, and with --checkpoint-storage reads the state
// from there.
func TestInspectOfACheckpointWithStateInStorageReadsItFromThere(t *testing.T) {
	dir := t.TempDir()
	u := "file://" + filepath.Join(t.TempDir(), "state")
	st, err := storage.Open(t.Context(), u)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	snap := checkpoint.TaskSnapshot{Task: "count#0", Operators: []checkpoint.OperatorSnapshot{{UID: "count", Parallelism: 1, MaxParallelism: 4,
		KeyGroups: map[int][]byte{1: bytes.Repeat([]byte("a"), 100), 3: bytes.Repeat([]byte("b"), 200)}}}}
	out, _, _, err := checkpoint.NewSegmentWriter(st, "j", -1).Write(t.Context(), 1, snap, nil)
	if err != nil {
		t.Fatal(err)
	}
	store, err := checkpoint.OpenStore(filepath.Join(dir, "checkpoints"))
	if err != nil {
		t.Fatal(err)
	}
	err = store.Save(t.Context(), checkpoint.Completed{Job: "j", ID: 1, TriggeredAt: time.Now(), CompletedAt: time.Now(),
		Tasks: map[checkpoint.TaskID]checkpoint.TaskSnapshot{out.Task: out}})
	if cerr := store.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCLI(t, "savepoint", "inspect", dir); err == nil || !strings.Contains(err.Error(), "--checkpoint-storage") {
		t.Fatalf("inspect without the storage: %v, want the flag named", err)
	}
	in := inspectJSON(t, dir, "--checkpoint-storage", u)
	if in.Bytes != 300 || len(in.Operators) != 1 || in.Operators[0].Subtasks[0].KeyGroupsWithState != 2 {
		t.Fatalf("inspection %+v: want 300 bytes in 2 key groups", in)
	}
}

// A checkpoint storage that cannot be written to (here a bucket that does
// not exist) stops the job manager, the task manager and run at startup,
// with S3's words and without the AWS SDK's request ids.
func TestAMissingBucketStopsEveryCommandAtStartup(t *testing.T) {
	srv, err := s3server.Start(t.Context(), s3server.Buckets("weir"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	t.Setenv("AWS_ACCESS_KEY_ID", "weir")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "weir")
	u := srv.URL("no-such-bucket", "cp")
	for _, args := range [][]string{
		{"jobmanager", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--checkpoint-storage", u},
		{"taskmanager", "--jobmanager", "127.0.0.1:1", "--checkpoint-storage", u},
		{"run", "wordcount", "--checkpoint-dir", t.TempDir(), "--checkpoint-storage", u},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		var out, errs bytes.Buffer
		root := newRootCmd(testRegistry(t), &out, &errs)
		root.SetArgs(args)
		err := root.ExecuteContext(ctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "NoSuchBucket") || strings.Contains(err.Error(), "RequestID") ||
			!strings.Contains(err.Error(), "checkpoint storage unusable") {
			t.Errorf("%s with a missing bucket: %v; want it refused at startup saying NoSuchBucket, without request ids", args[0], err)
		}
	}
}

// run --checkpoint-dir DIR without --checkpoint-storage writes task state
// to file://DIR/storage, as Flink's state.checkpoints.dir: the store keeps
// metadata and references (here every snapshot, with
// --state-inline-limit 0), and `savepoint inspect` and `state dump` of the
// directory read the state from there without being told where.
func TestRunWithACheckpointDirWritesTaskStateToStorageBesideTheStore(t *testing.T) {
	reg := weirruntime.NewRegistry()
	if err := nexmark.Register(reg); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var out, errb proctest.Buffer
	root := newRootCmd(reg, &out, &errb)
	root.SetArgs([]string{"run", "nexmark", "--set", "query=q3", "--set", "events=100000000", "--parallelism", "2",
		"--checkpoint-interval", "20ms", "--checkpoint-dir", dir, "--state-inline-limit", "0"})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	// Cancelled (as SIGINT) once checkpoints wrote 256 KiB of state to
	// storage: q3's join state only grows.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		var written int64
		_ = filepath.WalkDir(filepath.Join(dir, "storage"), func(_ string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				if fi, err := d.Info(); err == nil {
					written += fi.Size()
				}
			}
			return nil
		})
		if written >= 256<<10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing in %s after a minute; run's stderr:\n%s", filepath.Join(dir, "storage"), errb.String())
		}
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("run: %v\n%s", err, errb.String())
	}
	store, err := checkpoint.OpenStore(filepath.Join(dir, "checkpoints"), checkpoint.ReadOnly())
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := store.Jobs(t.Context())
	if err != nil || len(jobs) != 1 {
		store.Close()
		t.Fatalf("jobs in the run's store: %v, %v; want one", jobs, err)
	}
	c, err := store.Latest(t.Context(), jobs[0])
	store.Close()
	if err != nil {
		t.Fatal(err)
	}
	refs := c.Refs()
	if len(refs) == 0 {
		t.Fatalf("checkpoint %d keeps all its state inline (%d bytes); want references to %s", c.ID, c.Size(), filepath.Join(dir, "storage"))
	}
	for _, r := range refs {
		if _, err := os.Stat(filepath.Join(dir, "storage", filepath.FromSlash(r.Key))); err != nil {
			t.Fatalf("checkpoint %d references %s: %v", c.ID, r.Key, err)
		}
	}
	in := inspectJSON(t, dir)
	if in.Checkpoint != uint64(c.ID) || len(in.Operators) == 0 {
		t.Fatalf("inspect of the run dir: %+v; want checkpoint %d with its operators", in, c.ID)
	}
	keyed, entries := "", int64(0)
	for _, o := range in.Operators {
		for _, s := range o.States {
			if s.Entries > entries {
				keyed, entries = o.UID, s.Entries
			}
		}
	}
	if entries == 0 {
		t.Fatalf("inspect of the run dir reads no state entry: %+v", in.Operators)
	}
	dump, _, err := runCLI(t, "state", "dump", dir, "--operator", keyed)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(parseDump(t, dump)); int64(n) < entries {
		t.Fatalf("state dump of %s: %d entries, want at least the %d of its largest state", keyed, n, entries)
	}
}
