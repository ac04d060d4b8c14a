package cli

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/internal/proctest"
)

// startJobManager runs `streamctl jobmanager` in-process on loopback and
// returns its RPC address; it stops when the test ends.
func startJobManager(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, errs := &proctest.Buffer{}, &proctest.Buffer{}
	done := make(chan error, 1)
	go func() {
		root := newRootCmd(testRegistry(t), out, errs)
		root.SetArgs(append([]string{"jobmanager", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--data-dir", t.TempDir()}, args...))
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

// goPackage matches a Go package name of Weir said as the prefix of an
// error (at the start of the text or of a wrapped error in it).
var goPackage = regexp.MustCompile(`(^|: )(acklog|broker|checkpoint|failpoint|jobmanager|kafka|kafkatxn|rpc|runtime|sharegroup|taskmanager|uppercase|wordcount): `)

// The CLI's messages for the common failures are one line that names the
// job manager once and says what went wrong, with no Go package name of
// the code that made the error ("job manager: jobmanager: ..."): the
// errors are made without them, nothing strips them. Each still matches
// ErrJobManager.
func TestClientErrorsForCommonFailuresNameNoGoPackage(t *testing.T) {
	jm := startJobManager(t)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret-token-for-the-test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	guarded := startJobManager(t, "--auth-token-file", tokenFile)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"status of an unknown job", []string{"status", "0123", "--jobmanager", jm}, "Error: job manager: no such job: 0123\n"},
		{"cancel of an unknown job", []string{"cancel", "0123", "--jobmanager", jm}, "Error: job manager: no such job: 0123\n"},
		{"checkpoints of an unknown job", []string{"checkpoints", "0123", "--jobmanager", jm}, "Error: job manager: no such job: 0123\n"},
		{"submit of an unknown job type", []string{"submit", "nosuchjob", "--jobmanager", jm},
			"Error: job manager: unknown job type \"nosuchjob\""},
		{"submit with a parameter the job does not take", []string{"submit", "wordcount", "--set", "nosuch=1", "--jobmanager", jm},
			"Error: job manager: bad job parameter"},
		{"an unreachable job manager", []string{"list", "--jobmanager", "127.0.0.1:1"},
			"Error: job manager at 127.0.0.1:1 is unreachable"},
		{"a refused token", []string{"list", "--jobmanager", guarded},
			"Error: job manager at " + guarded + " refused the call: missing or wrong auth token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, err := runCLI(t, tc.args...)
			if !errors.Is(err, ErrJobManager) {
				t.Errorf("error %v does not match ErrJobManager", err)
			}
			if !strings.HasPrefix(stderr, tc.want) || strings.Count(stderr, "\n") != 1 {
				t.Errorf("stderr %q, want one line starting %q", stderr, tc.want)
			}
			if m := goPackage.FindString(stderr); m != "" {
				t.Errorf("stderr %q names a Go package: %q", stderr, m)
			}
		})
	}
}

// A job manager that cannot reach etcd: the CLI says so, and does not
// advise running the command again (it would not help).
func TestTheCLISaysWhenTheJobManagersCannotReachEtcd(t *testing.T) {
	jm := startJobManager(t, "--ha", "etcd", "--etcd-endpoints", "http://127.0.0.1:1",
		"--checkpoint-storage", "file://"+filepath.Join(t.TempDir(), "cp"))
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, _, err := runCLI(t, "list", "--jobmanager", jm)
		if err != nil && strings.Contains(err.Error(), "etcd unreachable at http://127.0.0.1:1") {
			if !strings.Contains(err.Error(), "cannot reach etcd") || strings.Contains(err.Error(), "run the command again") {
				t.Fatalf("list: %v; want it to say the job managers cannot reach etcd, without advising to run it again", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("list 30 s after the job manager started: %v; want it to say etcd is unreachable", err)
		}
	}
}
