package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/internal/proctest"
)

// Cases 8 and 9 of issue 31: a long-running command started with settings
// that leave the cluster open says so once, at startup: a token file others
// may write, a short token, a token without TLS beyond loopback, the
// embedded broker beyond loopback, --data-host beyond loopback without TLS.
func TestRiskySettingsAreWarnedAboutOnceAtStartup(t *testing.T) {
	dir := t.TempDir()
	weak := filepath.Join(dir, "weak-token")
	if err := os.WriteFile(weak, []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(weak, 0o666); err != nil { // past the umask
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"job manager with a weak token file, in clear beyond loopback",
			[]string{"jobmanager", "--listen", "0.0.0.0:0", "--http", "127.0.0.1:0", "--auth-token-file", weak},
			[]string{"is writable by group or others", "has 1 characters, fewer than 16", "with a token but without TLS"}},
		{"embedded broker beyond loopback", []string{"broker", "--listen", "0.0.0.0:0"},
			[]string{"the embedded broker listens beyond loopback"}},
		{"data host beyond loopback without TLS",
			[]string{"taskmanager", "--jobmanager", "127.0.0.1:1", "--data-host", "192.0.2.1", "--auth-token-file", weak},
			[]string{"--data-host 192.0.2.1 is beyond loopback", "is writable by group or others", "has 1 characters"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			out, errs := &proctest.Buffer{}, &proctest.Buffer{}
			done := make(chan error, 1)
			go func() {
				root := newRootCmd(testRegistry(t), out, errs)
				root.SetArgs(tc.args)
				done <- root.ExecuteContext(ctx)
			}()
			all := func() bool {
				for _, w := range tc.want {
					if !strings.Contains(errs.String(), w) {
						return false
					}
				}
				return true
			}
			for deadline := time.Now().Add(60 * time.Second); !all(); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					cancel()
					<-done
					t.Fatalf("no warnings %q in 60s; stderr:\n%s", tc.want, errs.String())
				}
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("%s: %v", tc.args[0], err)
			}
			for _, w := range tc.want {
				if n := strings.Count(errs.String(), w); n != 1 {
					t.Errorf("warning %q logged %d times, want once:\n%s", w, n, errs.String())
				}
			}
		})
	}
}
