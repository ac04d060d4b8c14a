package cli

import (
	"errors"
	"strings"
	"testing"

	"github.com/weirstream/weir/internal/failpoint"
)

// A bad WEIR_FAILPOINTS stops every command before it does anything, with
// an error quoting what the user wrote.
func TestBadFailpointsAreRefusedBeforeAnyWork(t *testing.T) {
	tests := []struct {
		spec    string
		args    []string
		mention string
	}{
		{"task.proces=crash", []string{"demo", "--lines", "10"}, `unknown failpoint "task.proces"`},
		{"sink.after-commit=explode", []string{"demo"}, `unknown action "explode"`},
		{"sink.after-commit=crash@0", []string{"bench", "--only", "eos-sink"}, "@N needs an integer N >= 1"},
		{"jm.after-checkpoint-persisted", []string{"broker", "--listen", "127.0.0.1:0"}, "want name=action"},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			t.Setenv(failpoint.EnvVar, tt.spec)
			stdout, stderr, err := runCLI(t, tt.args...)
			if !errors.Is(err, failpoint.ErrBadSpec) {
				t.Fatalf("%v = %v, want failpoint.ErrBadSpec", tt.args, err)
			}
			for _, want := range []string{tt.mention, failpoint.EnvVar + `="` + tt.spec + `"`} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
			if stdout != "" {
				t.Errorf("the command started before refusing: stdout %q", stdout)
			}
			if strings.Count(stderr, "Error: ") != 1 {
				t.Errorf("stderr %q: want the one error line", stderr)
			}
		})
	}
}
