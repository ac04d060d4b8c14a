package main

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

func TestRunRefusesBadInputWithAClearError(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown job", []string{"nope"}, `unknown job type "nope"`},
		{"unknown parameter", []string{"wordcount", "--set", "colour=red"}, `no parameter "colour"`},
		{"malformed set", []string{"wordcount", "--set", "brokers"}, "want key=value"},
		{"negative parallelism", []string{"wordcount", "--parallelism", "-1"}, "must not be negative"},
		{"zero interval", []string{"wordcount", "--checkpoint-interval", "0s"}, "must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(streamctlBin, append([]string{"run"}, tc.args...)...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Run(); err == nil {
				t.Fatal("exit 0, want an error")
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("stderr %q, want it to contain %q", stderr.String(), tc.want)
			}
		})
	}
}
