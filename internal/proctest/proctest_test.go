package proctest

import (
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// DefaultParallel sets go test's -parallel when the command line did not
// give it, and leaves a given one alone.
func TestDefaultParallelSetsParallelUnlessTheCommandLineGaveIt(t *testing.T) {
	f := flag.Lookup("test.parallel")
	was := f.Value.String()
	t.Cleanup(func() {
		if err := f.Value.Set(was); err != nil {
			t.Error(err)
		}
	})
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	want := 7
	if given {
		want, _ = strconv.Atoi(was)
	}
	DefaultParallel(7)
	if got := f.Value.String(); got != strconv.Itoa(want) {
		t.Fatalf("-parallel %s after DefaultParallel(7) (given on the command line: %v), want %d", got, given, want)
	}
}

// Main uses the binary named by BinEnv when it is set, builds one when it
// is unset, and refuses one it could not run.
func TestPrebuiltBinaryIsUsedWhenNamedAndRefusedWhenUnusable(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "streamctl")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, env, want string
		wantErr         bool
	}{
		{name: "unset: build one", env: "", want: ""},
		{name: "an executable file", env: exe, want: exe},
		{name: "a relative path", env: "streamctl", wantErr: true},
		{name: "a missing file", env: filepath.Join(dir, "missing"), wantErr: true},
		{name: "a file that is not executable", env: plain, wantErr: true},
		{name: "a directory", env: dir, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(BinEnv("streamctl"), tt.env)
			got, err := prebuilt("streamctl")
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("prebuilt with %s=%q = %q, %v; want %q, error %v", BinEnv("streamctl"), tt.env, got, err, tt.want, tt.wantErr)
			}
		})
	}
	if got := BinEnv("streamctl"); got != "WEIR_TEST_BIN_STREAMCTL" {
		t.Fatalf("BinEnv(streamctl) = %q", got)
	}
}
