package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// A job manager process, with its storage and savepoints on S3 and one
// more allowed directory, refuses every savepoint location a client names
// outside them, through the CLI and REST alike: a directory whose
// _metadata is a link to a 0600 file (its contents never in the answer), a
// path outside (the same answer whether it exists or not), "../", and
// savepoint URLs naming another endpoint, which receives no request. No
// job is created.
func TestAJobManagerProcessReadsAndWritesSavepointsOnlyWhereItAllows(t *testing.T) {
	t.Parallel()
	srv := startS3(t)
	var contacted atomic.Int64
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		contacted.Add(1)
		w.WriteHeader(http.StatusNotFound)
	}))
	t.Cleanup(elsewhere.Close)
	allowed, outside := t.TempDir(), t.TempDir()
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("SECRET-FIRST-LINE\nmore\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	evil := filepath.Join(allowed, "evil")
	if err := os.Mkdir(evil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(evil, "_metadata")); err != nil {
		t.Fatal(err)
	}
	c := newS3ProcCluster(t, "--checkpoint-storage", srv.URL("weir", "cp"), "--savepoint-dir", srv.URL("weir", "sp"),
		"--savepoint-allowed-locations", allowed)
	args := wordcountArgs(c.env.Addr, "wc", "lines", "counts")
	submit := func(from string) error {
		_, err := c.Run(append([]string{"submit"}, append(args, "--from-savepoint", from)...)...)
		return err
	}
	const notAllowed = "not an allowed savepoint location"
	for _, tc := range []struct {
		name string
		run  func() error
		want string
	}{
		{"a linked _metadata", func() error { return submit(evil) }, "symbolic link refused"},
		{"a file outside", func() error { return submit(secret) }, notAllowed},
		{"a missing path outside", func() error { return submit(filepath.Join(outside, "missing")) }, notAllowed},
		{"dot-dot", func() error { return submit(allowed + "/../" + filepath.Base(outside)) }, notAllowed},
		{"another endpoint", func() error { return submit("s3://weir/sp/x?endpoint=" + elsewhere.URL) }, notAllowed},
		{"savepoint --target with dot-dot", func() error {
			_, err := c.Run("savepoint", "0123456789abcdef0123456789abcdef", "--target", allowed+"/../"+filepath.Base(outside))
			return err
		}, notAllowed},
		{"stop --savepoint at another endpoint", func() error {
			_, err := c.Run("stop", "0123456789abcdef0123456789abcdef", "--savepoint", "s3://weir/sp?endpoint="+elsewhere.URL)
			return err
		}, notAllowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "SECRET") {
				t.Fatalf("%v; want a refusal saying %q, quoting nothing of the file", err, tc.want)
			}
		})
	}
	// REST: Flink's savepoint trigger with a target outside.
	resp, err := http.Post("http://"+c.HTTPAddr+"/jobs/0123456789abcdef0123456789abcdef/savepoints", "application/json",
		bytes.NewReader([]byte(`{"target-directory":"`+outside+`"}`)))
	if err != nil {
		t.Fatal(err)
	}
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body.String(), notAllowed) {
		t.Fatalf("POST savepoints with a target outside: %d %s; want 400 %q", resp.StatusCode, body.String(), notAllowed)
	}
	if n := contacted.Load(); n != 0 {
		t.Fatalf("the endpoint a client named received %d requests from the job manager", n)
	}
	if list, err := c.Run("list", "--output", "json"); err != nil || strings.Contains(list, `"id"`) {
		t.Fatalf("list after the refusals: %q, %v; want no job", list, err)
	}
}
