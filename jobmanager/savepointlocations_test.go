package jobmanager_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/checkpoint/storage"
	"github.com/weirstream/weir/internal/s3server"
	"github.com/weirstream/weir/jobmanager"
	"github.com/weirstream/weir/runtime"
)

// otherSavepoint writes a valid savepoint of an operator the numbers job
// does not have at loc: a submit that reads it is refused with
// runtime.ErrIncompatibleState, which proves it was read.
func otherSavepoint(t *testing.T, loc string, opts ...checkpoint.SavepointOpt) {
	t.Helper()
	c := checkpoint.Completed{Job: "old", ID: 3, Tasks: map[checkpoint.TaskID]checkpoint.TaskSnapshot{
		"other#0": {Task: "other#0", Operators: []checkpoint.OperatorSnapshot{{UID: "other", Parallelism: 1, State: [][]byte{[]byte("s")}}}},
	}}
	if err := checkpoint.WriteSavepoint(t.Context(), loc, c, time.Unix(100, 0), opts...); err != nil {
		t.Fatal(err)
	}
}

// A client may name savepoint locations (submit's savepoint, a savepoint's
// target) only under the job manager's savepoint directory, its data
// directory and the allowed locations: a path outside them is refused
// without a word on whether it exists, ".." is refused, no symbolic link
// below an allowed directory is followed, and a savepoint URL may not
// change the endpoint, region or bucket of an allowed one: the job
// manager never sends a request (signed with its credentials) to an
// endpoint a client chose. Locations inside are read as before.
func TestClientNamedSavepointLocationsAreConfinedToTheAllowedOnes(t *testing.T) {
	srv, err := s3server.Start(t.Context(), s3server.Buckets("weir", "other"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	var contacted atomic.Int64
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		contacted.Add(1)
		w.WriteHeader(http.StatusNotFound)
	}))
	t.Cleanup(elsewhere.Close)

	creds := storage.Credentials("weir", "weir")
	dataDir, allowed, outside := t.TempDir(), t.TempDir(), t.TempDir()
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("SECRET first line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	otherSavepoint(t, filepath.Join(outside, "sp"))
	otherSavepoint(t, filepath.Join(allowed, "good"))
	otherSavepoint(t, filepath.Join(dataDir, "retained", "good"))
	otherSavepoint(t, srv.URL("weir", "sp/good"), checkpoint.StorageOptions(creds))
	if err := os.Symlink(filepath.Join(outside, "sp"), filepath.Join(allowed, "dir-link")); err != nil {
		t.Fatal(err)
	}
	// An allowed directory below another one (the data directory), itself
	// a link the operator made.
	linkedRoot := filepath.Join(dataDir, "linked-root")
	if err := os.Symlink(filepath.Join(outside), linkedRoot); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(allowed, "meta-link"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(allowed, "meta-link", checkpoint.SavepointMetadataFile)); err != nil {
		t.Fatal(err)
	}

	s, err := jobmanager.New(jobmanager.Jobs(numbersRegistry(t)), jobmanager.HeartbeatTimeout(time.Hour), jobmanager.DataDir(dataDir),
		jobmanager.CheckpointStorage(srv.URL("weir", "cp"), creds), jobmanager.SavepointDir(srv.URL("weir", "sp")),
		jobmanager.SavepointAllowedLocations(allowed, linkedRoot))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	addr, _ := serve(t, s)
	register(t, addr, "tm-1", 1)
	waitFor(t, s, "registered task manager", func(tms []jobmanager.TaskManager) bool { return len(tms) == 1 })

	host := strings.TrimPrefix(elsewhere.URL, "http://")
	for _, tc := range []struct {
		name, loc string
		want      error // nil: read, refused only as another job's state
	}{
		{"a savepoint outside", filepath.Join(outside, "sp"), jobmanager.ErrSavepointLocation},
		{"a missing path outside", filepath.Join(outside, "missing"), jobmanager.ErrSavepointLocation},
		{"a file outside", secret, jobmanager.ErrSavepointLocation},
		{"dot-dot out of an allowed directory", filepath.Join(allowed, "..", filepath.Base(outside), "sp"), jobmanager.ErrSavepointLocation},
		{"dot-dot back in", allowed + "/x/../good", jobmanager.ErrSavepointLocation},
		{"a file URL outside", "file://" + filepath.Join(outside, "sp"), jobmanager.ErrSavepointLocation},
		{"escaped dot-dot in a URL", "s3://weir/sp/%2e%2e/cp/good", jobmanager.ErrSavepointLocation},
		{"escaped dot-dot in a file URL", "file://" + allowed + "/%2E%2E/" + filepath.Base(outside) + "/sp", jobmanager.ErrSavepointLocation},
		{"a linked directory", filepath.Join(allowed, "dir-link"), storage.ErrSymlink},
		{"a linked _metadata", filepath.Join(allowed, "meta-link"), storage.ErrSymlink},
		{"another endpoint", "s3://weir/sp/good?endpoint=" + elsewhere.URL, jobmanager.ErrSavepointLocation},
		{"another endpoint, another bucket", "s3://other/good?endpoint=" + elsewhere.URL, jobmanager.ErrSavepointLocation},
		{"another endpoint by host", "s3://" + host + "/sp/good", jobmanager.ErrSavepointLocation},
		{"another region", "s3://weir/sp/good?region=eu-west-1", jobmanager.ErrSavepointLocation},
		{"outside the prefix", "s3://weir/cp/good", jobmanager.ErrSavepointLocation},
		{"an allowed directory", filepath.Join(allowed, "good"), nil},
		{"an allowed file URL", "file://" + filepath.Join(allowed, "good"), nil},
		{"the data directory", filepath.Join(dataDir, "retained", "good"), nil},
		{"an allowed link below the data directory", filepath.Join(linkedRoot, "sp"), nil},
		{"the savepoint URL without its endpoint", "s3://weir/sp/good", nil},
		{"the savepoint URL with its endpoint", srv.URL("weir", "sp/good"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Submit(t.Context(), "numbers", nil, time.Hour, "", jobmanager.FromSavepoint(tc.loc))
			switch {
			case tc.want == nil && !errors.Is(err, runtime.ErrIncompatibleState):
				t.Fatalf("submit from %s: %v; want the savepoint read (and refused as another job's)", tc.loc, err)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("submit from %s: %v; want %v", tc.loc, err, tc.want)
			case err != nil && strings.Contains(err.Error(), "SECRET"):
				t.Fatalf("the error quotes the secret: %v", err)
			}
			if tc.want == jobmanager.ErrSavepointLocation {
				// The same words whether the path exists or not.
				if got, want := strings.ReplaceAll(err.Error(), tc.loc, "LOC"),
					`savepoint location "LOC": not an allowed savepoint location`; !strings.HasPrefix(got, want) {
					t.Errorf("error %q; want it to start %q", got, want)
				}
			}
			// A savepoint target is checked the same way, before the job.
			_, err = s.StartSavepoint(t.Context(), "no-such-job", tc.loc, false, false)
			if tc.want == jobmanager.ErrSavepointLocation && !errors.Is(err, tc.want) || tc.want == nil && !errors.Is(err, jobmanager.ErrJobNotFound) {
				t.Errorf("savepoint target %s: %v", tc.loc, err)
			}
		})
	}
	if n := contacted.Load(); n != 0 {
		t.Fatalf("the endpoint a client named received %d requests", n)
	}
}
