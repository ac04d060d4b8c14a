package checkpoint

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/internal/s3server"
)

// savepointFixture is a checkpoint of two operators at parallelism 2: a
// source with operator state and a transaction, a keyed counter with key
// groups, and an empty entry and key group (which must survive as empty).
func savepointFixture() Completed {
	h := func(id string) TxnHandle {
		return TxnHandle{TransactionalID: id, ProducerID: 7, Epoch: 3, Checkpoint: 12,
			Partitions: []TxnPartition{{Topic: "counts", Partition: 1, FirstOffset: 40}}}
	}
	wm := int64(1_700_000_000_000)
	return Completed{Job: "job-1", ID: 12, Tasks: map[TaskID]TaskSnapshot{
		"source#0": {Task: "source#0", Operators: []OperatorSnapshot{
			{UID: "source", Subtask: 0, Parallelism: 2, State: [][]byte{[]byte("offsets-0"), {}}, Handles: []TxnHandle{h("acks-0")}, Watermark: &wm},
		}},
		"source#1": {Task: "source#1", Operators: []OperatorSnapshot{
			{UID: "source", Subtask: 1, Parallelism: 2, State: [][]byte{[]byte("offsets-1")}},
		}},
		"count#0": {Task: "count#0", Operators: []OperatorSnapshot{
			{UID: "count", Subtask: 0, Parallelism: 2, MaxParallelism: 4, KeyGroups: map[int][]byte{0: []byte("a=1"), 1: {}}},
			{UID: "sink", Subtask: 0, Parallelism: 2, Handles: []TxnHandle{h("sink-0")}},
		}},
		"count#1": {Task: "count#1", Operators: []OperatorSnapshot{
			{UID: "count", Subtask: 1, Parallelism: 2, MaxParallelism: 4, KeyGroups: map[int][]byte{2: []byte("b=2"), 3: []byte("c=3")}},
			{UID: "sink", Subtask: 1, Parallelism: 2},
		}},
	}}
}

// byOperator indexes a checkpoint's snapshots by UID and subtask, the way a
// restore matches them.
func byOperator(t *testing.T, c Completed) map[string]OperatorSnapshot {
	t.Helper()
	out := map[string]OperatorSnapshot{}
	for _, ts := range c.Tasks {
		for _, op := range ts.Operators {
			k := fmt.Sprintf("%s#%d", op.UID, op.Subtask)
			if _, dup := out[k]; dup {
				t.Fatalf("two snapshots of %s", k)
			}
			out[k] = op
		}
	}
	return out
}

// savepointLocations are where the savepoint tests write: a directory, and
// a place on the embedded S3 server (through the real AWS client).
func savepointLocations() map[string]func(t *testing.T) (string, []SavepointOpt) {
	return map[string]func(t *testing.T) (string, []SavepointOpt){
		"directory": func(t *testing.T) (string, []SavepointOpt) { return filepath.Join(t.TempDir(), "sp"), nil },
		"S3": func(t *testing.T) (string, []SavepointOpt) {
			srv, err := s3server.Start(t.Context(), s3server.Buckets("weir"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Close() })
			return srv.URL("weir", "savepoints/sp"), []SavepointOpt{StorageOptions(storage.Credentials("weir", "weir"))}
		},
	}
}

func TestSavepointRoundTripsEveryOperatorSnapshot(t *testing.T) {
	for name, at := range savepointLocations() {
		t.Run(name, func(t *testing.T) {
			loc, opts := at(t)
			want := savepointFixture()
			if err := WriteSavepoint(t.Context(), loc, want, time.Unix(100, 0), opts...); err != nil {
				t.Fatal(err)
			}
			got, err := ReadSavepoint(t.Context(), loc, opts...)
			if err != nil {
				t.Fatal(err)
			}
			checkSameSavepoint(t, got, want)
		})
	}
}

// checkSameSavepoint fails unless got holds every snapshot and handle of
// want.
func checkSameSavepoint(t *testing.T, got, want Completed) {
	t.Helper()
	if got.Job != want.Job || got.ID != want.ID {
		t.Fatalf("read job %q checkpoint %d, want %q %d", got.Job, got.ID, want.Job, want.ID)
	}
	g, w := byOperator(t, got), byOperator(t, want)
	if len(g) != len(w) {
		t.Fatalf("read %d operator snapshots, want %d", len(g), len(w))
	}
	for k, ws := range w {
		if !reflect.DeepEqual(normalize(g[k]), normalize(ws)) {
			t.Errorf("%s: read %+v, want %+v", k, g[k], ws)
		}
	}
	if !reflect.DeepEqual(handleSet(got), handleSet(want)) {
		t.Errorf("handles: read %v, want %v", handleSet(got), handleSet(want))
	}
}

// A savepoint written to object storage, copied object by object into a
// directory, reads the same there: nothing in it names its bucket. A
// missing state object, or a location without _metadata, is refused as
// in a directory.
func TestASavepointOnS3MovesToADirectoryAndIsRefusedWhenDamaged(t *testing.T) {
	loc, opts := savepointLocations()["S3"](t)
	if err := WriteSavepoint(t.Context(), loc, savepointFixture(), time.Unix(100, 0), opts...); err != nil {
		t.Fatal(err)
	}
	st, err := storage.Open(t.Context(), loc, storage.Credentials("weir", "weir"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	dir := filepath.Join(t.TempDir(), "copy")
	var keys []string
	if err := st.List(t.Context(), "", func(o storage.Object) error {
		keys = append(keys, o.Key)
		r, err := st.Open(t.Context(), o.Key, 0, -1)
		if err != nil {
			return err
		}
		defer r.Close()
		b, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, o.Key)), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, o.Key), b, 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"_metadata", "state/count.bin", "state/sink.bin", "state/source.bin"}; !slices.Equal(keys, want) {
		t.Fatalf("objects of the savepoint: %v, want %v", keys, want)
	}
	got, err := ReadSavepoint(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	checkSameSavepoint(t, got, savepointFixture())

	if err := st.Delete(t.Context(), "state/source.bin"); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadSavepoint(t.Context(), loc, opts...); !errors.Is(err, ErrCorruptSavepoint) || !strings.Contains(err.Error(), "state/source.bin") {
		t.Fatalf("read without state/source.bin: %v, want ErrCorruptSavepoint naming it", err)
	}
	if err := st.Delete(t.Context(), SavepointMetadataFile); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadSavepoint(t.Context(), loc, opts...); !errors.Is(err, ErrNotSavepoint) {
		t.Fatalf("read without _metadata: %v, want ErrNotSavepoint", err)
	}
}

// normalize maps nil and empty byte slices alike (JSON and files do not
// keep the difference, and neither does a restore).
func normalize(op OperatorSnapshot) OperatorSnapshot {
	for i, e := range op.State {
		if len(e) == 0 {
			op.State[i] = []byte{}
		}
	}
	for kg, b := range op.KeyGroups {
		if len(b) == 0 {
			op.KeyGroups[kg] = []byte{}
		}
	}
	return op
}

func handleSet(c Completed) map[string]TxnHandle {
	out := map[string]TxnHandle{}
	for _, h := range c.Handles() {
		out[h.TransactionalID] = h
	}
	return out
}

func TestSavepointReadsAfterItsDirectoryMoved(t *testing.T) {
	src := filepath.Join(t.TempDir(), "sp")
	if err := WriteSavepoint(t.Context(), src, savepointFixture(), time.Unix(100, 0)); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(src); err != nil {
		t.Fatal(err)
	}
	got, err := ReadSavepoint(t.Context(), dst)
	if err != nil {
		t.Fatal(err)
	}
	if g, w := byOperator(t, got), byOperator(t, savepointFixture()); len(g) != len(w) {
		t.Fatalf("read %d snapshots from the copy, want %d", len(g), len(w))
	}
}

func TestSavepointIsNeverWrittenOverAnother(t *testing.T) {
	for name, at := range savepointLocations() {
		t.Run(name, func(t *testing.T) {
			loc, opts := at(t)
			if err := WriteSavepoint(t.Context(), loc, savepointFixture(), time.Unix(100, 0), opts...); err != nil {
				t.Fatal(err)
			}
			other := savepointFixture()
			other.ID = 13
			if err := WriteSavepoint(t.Context(), loc, other, time.Unix(200, 0), opts...); !errors.Is(err, ErrSavepointExists) {
				t.Fatalf("second write into %s: %v, want ErrSavepointExists", loc, err)
			}
			got, err := ReadSavepoint(t.Context(), loc, opts...)
			if err != nil || got.ID != 12 {
				t.Fatalf("after the refused write: checkpoint %d, %v; want 12", got.ID, err)
			}
		})
	}
}

// rewriteMetadata replaces the savepoint's metadata body, with a valid
// header, as a crafted or newer savepoint would have it.
func rewriteMetadata(t *testing.T, dir string, version int, edit func(string) string) {
	t.Helper()
	file := filepath.Join(dir, SavepointMetadataFile)
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	_, body, _ := strings.Cut(string(raw), "\n")
	body = edit(body)
	header := fmt.Sprintf("%s %d crc32c=%08x length=%d\n", savepointMagic, version, crc32.Checksum([]byte(body), castagnoli), len(body))
	if err := os.WriteFile(file, []byte(header+body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestDamagedSavepointFailsWithOneErrorNamingTheFile(t *testing.T) {
	flip := func(name string, at int64) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			f := filepath.Join(dir, name)
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if at < 0 {
				at += int64(len(b))
			}
			b[at] ^= 0x20
			if err := os.WriteFile(f, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	truncate := func(name string, by int64) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			f := filepath.Join(dir, name)
			fi, err := os.Stat(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(f, fi.Size()-by); err != nil {
				t.Fatal(err)
			}
		}
	}
	cases := []struct {
		name   string
		damage func(t *testing.T, dir string)
		want   error
		names  string // the error must name this
	}{
		{"a flipped state byte", flip("state/count.bin", 1), ErrCorruptSavepoint, "state/count.bin"},
		{"a truncated state file", truncate("state/count.bin", 2), ErrCorruptSavepoint, "state/count.bin"},
		{"a missing state file", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, "state", "source.bin")); err != nil {
				t.Fatal(err)
			}
		}, ErrCorruptSavepoint, "state/source.bin"},
		{"a flipped metadata byte", flip(SavepointMetadataFile, -10), ErrCorruptSavepoint, SavepointMetadataFile},
		{"truncated metadata", truncate(SavepointMetadataFile, 7), ErrCorruptSavepoint, SavepointMetadataFile},
		{"a damaged header", flip(SavepointMetadataFile, 0), ErrCorruptSavepoint, SavepointMetadataFile},
		{"no metadata: the write never finished", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, SavepointMetadataFile)); err != nil {
				t.Fatal(err)
			}
		}, ErrNotSavepoint, SavepointMetadataFile},
		{"a later format version", func(t *testing.T, dir string) {
			rewriteMetadata(t, dir, SavepointVersion+1, func(s string) string { return s })
		}, ErrSavepointVersion, "format 2"},
		{"metadata pointing outside the directory", func(t *testing.T, dir string) {
			// A file that would read back fine, were it opened.
			b, err := os.ReadFile(filepath.Join(dir, "state", "count.bin"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "..", "count.bin"), b, 0o644); err != nil {
				t.Fatal(err)
			}
			rewriteMetadata(t, dir, SavepointVersion, func(s string) string {
				return strings.ReplaceAll(s, `"state/count.bin"`, `"state/../../count.bin"`)
			})
		}, ErrCorruptSavepoint, "state/../../count.bin"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "sp")
			if err := WriteSavepoint(t.Context(), dir, savepointFixture(), time.Unix(100, 0)); err != nil {
				t.Fatal(err)
			}
			tc.damage(t, dir)
			_, err := ReadSavepoint(t.Context(), dir)
			if !errors.Is(err, tc.want) {
				t.Fatalf("read: %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.names) {
				t.Fatalf("error %q does not name %q", err, tc.names)
			}
		})
	}
}

func TestReadingAMissingDirectoryIsNotASavepoint(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nowhere")
	if _, err := ReadSavepoint(t.Context(), dir); !errors.Is(err, ErrNotSavepoint) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("read %s: %v, want ErrNotSavepoint naming it", dir, err)
	}
}

func TestSavepointLocationsJoinAsDirectoriesOrURLs(t *testing.T) {
	abs, err := filepath.Abs("rel")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		base, name, want string
		url              bool
	}{
		{"/var/sp", "savepoint-abc-3", "/var/sp/savepoint-abc-3", false},
		{"rel", "x", filepath.Join(abs, "x"), false},
		{"s3://weir/sp?endpoint=http://127.0.0.1:9000", "savepoint-abc-3", "s3://weir/sp/savepoint-abc-3?endpoint=http://127.0.0.1:9000", true},
		{"s3://weir/sp/", "retained-abc-4", "s3://weir/sp/retained-abc-4", true},
		{"s3://weir", "savepoint-abc-3", "s3://weir/savepoint-abc-3", true},
		{"file:///var/sp", "savepoint-abc-3", "file:///var/sp/savepoint-abc-3", true},
		{"./odd://dir", "x", filepath.Join(filepath.Dir(abs), "odd:", "dir", "x"), false},
	} {
		if got := IsSavepointURL(tc.base); got != tc.url {
			t.Errorf("IsSavepointURL(%q) = %v, want %v", tc.base, got, tc.url)
		}
		got, err := JoinSavepointLocation(tc.base, tc.name)
		if err != nil || got != tc.want {
			t.Errorf("JoinSavepointLocation(%q, %q) = %q, %v; want %q", tc.base, tc.name, got, err, tc.want)
		}
	}
}

// A savepoint read Beneath a root (as a job manager reads one a client
// named) follows no symbolic link: not a _metadata or state file linked to
// a secret, not a savepoint directory linked to one outside, and it writes
// through none. Read without it (the CLI, with its user's own rights), the
// same links are followed, but no error quotes what the file holds, its
// size or its checksum.
func TestASavepointReadBeneathARootFollowsNoLinkAndItsErrorsQuoteNothing(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	secretText := "SECRET-FIRST-LINE token=abc\nmore secret bytes\n"
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte(secretText), 0o600); err != nil {
		t.Fatal(err)
	}
	real := filepath.Join(outside, "real")
	if err := WriteSavepoint(t.Context(), real, savepointFixture(), time.Unix(100, 0)); err != nil {
		t.Fatal(err)
	}
	link := func(target, name string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, name); err != nil {
			t.Fatal(err)
		}
	}
	// A _metadata linked to the secret.
	metaLink := filepath.Join(root, "meta-link")
	link(secret, filepath.Join(metaLink, SavepointMetadataFile))
	// A valid savepoint whose state file is linked to the secret.
	stateLink := filepath.Join(root, "state-link")
	if err := WriteSavepoint(t.Context(), stateLink, savepointFixture(), time.Unix(100, 0)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(stateLink, "state", "count.bin")); err != nil {
		t.Fatal(err)
	}
	link(secret, filepath.Join(stateLink, "state", "count.bin"))
	// The savepoint directory itself a link out of the root.
	dirLink := filepath.Join(root, "dir-link")
	link(real, dirLink)
	secretSum := fmt.Sprintf("%08x", crc32.Checksum([]byte(secretText), castagnoli))
	quotes := func(err error) bool {
		// The temporary root's random digits may hold the secret's
		// length: only the rest of the message counts.
		s := strings.ReplaceAll(err.Error(), root, "ROOT")
		return strings.Contains(s, "SECRET") || strings.Contains(s, secretSum) || strings.Contains(s, fmt.Sprint(len(secretText)))
	}
	for _, loc := range []string{metaLink, stateLink, dirLink} {
		t.Run(filepath.Base(loc), func(t *testing.T) {
			c, err := ReadSavepoint(t.Context(), loc, Beneath(root))
			if !errors.Is(err, storage.ErrSymlink) || quotes(err) {
				t.Errorf("read beneath the root: %d tasks, %v; want ErrSymlink quoting nothing", len(c.Tasks), err)
			}
			if _, err := ReadSavepoint(t.Context(), loc); loc != dirLink && (err == nil || quotes(err)) {
				t.Errorf("read unconfined: %v; want an error quoting nothing of the file", err)
			}
		})
	}
	if err := WriteSavepoint(t.Context(), filepath.Join(dirLink, "new"), savepointFixture(), time.Unix(100, 0), Beneath(root)); !errors.Is(err, storage.ErrSymlink) {
		t.Errorf("write through a linked directory: %v; want ErrSymlink", err)
	}
	if _, err := os.Stat(filepath.Join(real, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the write went through the link: %v", err)
	}
	// A regular savepoint below the root reads as before.
	ok := filepath.Join(root, "a", "ok")
	if err := WriteSavepoint(t.Context(), ok, savepointFixture(), time.Unix(100, 0), Beneath(root)); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadSavepoint(t.Context(), ok, Beneath(root)); err != nil {
		t.Fatal(err)
	}
}
