package cli

import (
	"context"
	"errors"
	"regexp"
	"testing"
	"time"

	"github.com/weirstream/weir/internal/proctest"
)

// startJobManager runs `streamctl jobmanager` in-process on loopback and
// returns its RPC address; it stops when the test ends.
func startJobManager(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, errs := &proctest.Buffer{}, &proctest.Buffer{}
	done := make(chan error, 1)
	go func() {
		root := newRootCmd(testRegistry(t), out, errs)
		root.SetArgs([]string{"jobmanager", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--data-dir", t.TempDir()})
		done <- root.ExecuteContext(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("jobmanager: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Errorf("jobmanager did not stop within 60s")
		}
	})
	re := regexp.MustCompile(`(?m)^jobmanager listening on (\S+)$`)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			return m[1]
		}
		select {
		case err := <-done:
			t.Fatalf("jobmanager ended: %v\n%s", err, errs.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("jobmanager printed no address in 30s: %q", out.String())
		}
	}
}

// An error the job manager answers is printed as one line that names the
// job manager once, without the Go package names of the code that made it
// ("job manager: jobmanager: ..."), and still matches ErrJobManager.
func TestClientErrorsFromTheJobManagerNameNoGoPackage(t *testing.T) {
	jm := startJobManager(t)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"status of an unknown job", []string{"status", "0123"}, "Error: job manager: no such job: 0123\n"},
		{"cancel of an unknown job", []string{"cancel", "0123"}, "Error: job manager: no such job: 0123\n"},
		{"checkpoints of an unknown job", []string{"checkpoints", "0123"}, "Error: job manager: no such job: 0123\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, err := runCLI(t, append(tc.args, "--jobmanager", jm)...)
			if !errors.Is(err, ErrJobManager) {
				t.Errorf("error %v does not match ErrJobManager", err)
			}
			if stderr != tc.want {
				t.Errorf("stderr %q, want %q", stderr, tc.want)
			}
		})
	}
}

// Go package prefixes go, wherever they are in the chain; other words stay.
func TestWithoutGoPackagesStripsPackagePrefixes(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"jobmanager: no such job: 0123", "no such job: 0123"},
		{"rpc: missing or wrong auth token (--auth-token-file)", "missing or wrong auth token (--auth-token-file)"},
		{"jobmanager: job refused by its check: brokers 127.0.0.1:1: sharegroup: brokers unreachable: dial tcp: refused",
			"job refused by its check: brokers 127.0.0.1:1: brokers unreachable: dial tcp: refused"},
		{"parallelism 2 and parameter parallelism=3 disagree", "parallelism 2 and parameter parallelism=3 disagree"},
		{"runtime: checkpoint: x", "x"},
	} {
		if got := withoutGoPackages(tc.in); got != tc.want {
			t.Errorf("withoutGoPackages(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
