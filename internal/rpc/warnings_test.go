package rpc_test

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/weirstream/weir/internal/rpc"
)

// Case 8 of issue 31: a token file others may write or read, and a short
// token, are warned about; a private file with a long token is not.
func TestTokenWarningsNameRiskyFilesAndShortTokens(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("permission bits mean nothing on Windows")
	}
	const long = "0123456789abcdef0123"
	for _, tc := range []struct {
		name  string
		mode  os.FileMode
		token string
		want  []string // a substring per warning, in order
	}{
		{"private, long", 0o600, long, nil},
		{"group-readable, long", 0o640, long, nil},
		{"world-writable, one character", 0o666, "x", []string{"writable by group or others", "has 1 characters"}},
		{"group-writable", 0o620, long, []string{"writable by group or others"}},
		{"world-readable", 0o604, long, []string{"readable by others"}},
		{"private, short", 0o600, "s3cret", []string{"has 6 characters, fewer than 16"}},
		{"private, exactly the minimum", 0o600, long[:rpc.MinTokenLength], nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "token")
			if err := os.WriteFile(path, []byte(tc.token+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, tc.mode); err != nil {
				t.Fatal(err)
			}
			token, err := rpc.ReadToken(path)
			if err != nil {
				t.Fatal(err)
			}
			got := rpc.TokenWarnings(path, token)
			if len(got) != len(tc.want) {
				t.Fatalf("warnings %q, want %d", got, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) || !strings.Contains(got[i], path) {
					t.Errorf("warning %q, want it to say %q and name the file", got[i], w)
				}
				if strings.Contains(got[i], tc.token) && len(tc.token) > 1 {
					t.Errorf("warning %q shows the token", got[i])
				}
			}
		})
	}
}

// Case 8 and 9 of issue 31: a token without TLS, the embedded broker and
// --data-host without TLS are warned about when beyond loopback, and only
// then.
func TestExposureWarningsOnlyBeyondLoopback(t *testing.T) {
	for _, tc := range []struct {
		name     string
		inClear  []string
		broker   string
		dataHost string
		want     []string
	}{
		{"all on loopback", []string{"127.0.0.1:6123", "localhost:8081"}, "127.0.0.1:9092", "127.0.0.1", nil},
		{"IPv6 loopback", []string{"[::1]:6123"}, "[::1]:9092", "::1", nil},
		{"nothing", nil, "", "", nil},
		{"token in clear on every interface", []string{"0.0.0.0:6123", "127.0.0.1:8081"}, "", "", []string{"0.0.0.0:6123 with a token but without TLS"}},
		{"token in clear on an empty host", []string{":8081"}, "", "", []string{":8081 with a token but without TLS"}},
		{"broker on an address", nil, "192.0.2.7:9092", "", []string{"embedded broker listens beyond loopback on 192.0.2.7:9092 and has no authentication"}},
		{"data host by name", nil, "", "tm1.example.com", []string{"--data-host tm1.example.com is beyond loopback"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := rpc.ExposureWarnings(tc.inClear, tc.broker, tc.dataHost)
			if len(got) != len(tc.want) {
				t.Fatalf("warnings %q, want %q", got, tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("warning %q, want it to say %q", got[i], w)
				}
			}
		})
	}
}
