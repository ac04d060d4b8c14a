package jobmanager_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.uber.org/zap/zapcore"

	"github.com/weirstream/weir/jobmanager"
)

// restDo makes one request to the job manager's HTTP API at base with the
// given Host (none: the server's address) and headers, and returns the
// status and body.
func restDo(t *testing.T, base, method, path, host string, header map[string]string, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// Case 6 of issue 31: a web page the developer opens must neither read nor
// cancel their jobs. Through DNS rebinding its requests carry its own Host
// name: answered 421 (Misdirected Request). A cross-site "simple" request
// (a form POST, or fetch with text/plain: no CORS preflight) that tries to
// cancel a job is answered 403, and the job goes on. A state-changing call
// with Content-Type: application/json (the dashboard's) or X-Weir-Request
// still works.
func TestBrowserAttacksCannotReadOrCancelAJob(t *testing.T) {
	s, _, id := resumedJobWaitingForSlots(t, func(zapcore.Entry) {})
	hs := httptest.NewServer(s.HTTPHandler())
	t.Cleanup(hs.Close)
	before, _, err := s.Job(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, method, path, host string
		header                   map[string]string
		body                     string
		code                     int
	}{
		{"rebound read of the job", http.MethodGet, "/jobs/" + id, "attacker.example", nil, "", http.StatusMisdirectedRequest},
		{"rebound read of the list", http.MethodGet, "/jobs/overview", "rebind.attacker.example:8081", nil, "", http.StatusMisdirectedRequest},
		{"rebound dashboard", http.MethodGet, "/", "attacker.example", nil, "", http.StatusMisdirectedRequest},
		{"rebound cancel, even non-simple", http.MethodPost, "/jobs/" + id + "/cancel", "attacker.example",
			map[string]string{"Content-Type": "application/json"}, "{}", http.StatusMisdirectedRequest},
		{"cross-site text/plain cancel", http.MethodPost, "/jobs/" + id + "/cancel", "",
			map[string]string{"Content-Type": "text/plain", "Origin": "http://attacker.example"}, "x", http.StatusForbidden},
		{"cross-site form cancel", http.MethodPost, "/jobs/" + id + "/cancel", "",
			map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Origin": "null"}, "a=b", http.StatusForbidden},
		{"cancel with no content type", http.MethodPost, "/jobs/" + id + "/cancel", "", nil, "", http.StatusForbidden},
		{"cross-site PATCH cancel", http.MethodPatch, "/jobs/" + id + "?mode=cancel", "",
			map[string]string{"Content-Type": "multipart/form-data; boundary=x"}, "", http.StatusForbidden},
		{"same-site read", http.MethodGet, "/jobs/" + id, "", nil, "", http.StatusOK},
		{"read by localhost", http.MethodGet, "/jobs/" + id, "localhost:8081", nil, "", http.StatusOK},
	} {
		code, body := restDo(t, hs.URL, tc.method, tc.path, tc.host, tc.header, tc.body)
		if code != tc.code {
			t.Errorf("%s: %s %s (Host %q): %d %s, want %d", tc.name, tc.method, tc.path, tc.host, code, body, tc.code)
		}
		if code >= 400 {
			var e struct{ Errors []string }
			if err := json.Unmarshal([]byte(body), &e); err != nil || len(e.Errors) != 1 {
				t.Errorf("%s: body %q, want Flink's {\"errors\":[...]}", tc.name, body)
			}
		}
	}
	after, _, err := s.Job(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if after.State == jobmanager.StateCanceled || after.State != before.State {
		t.Fatalf("after the attacks the job is %s, want %s as before", after.State, before.State)
	}

	// The dashboard's cancel: a JSON POST from its own origin.
	code, body := restDo(t, hs.URL, http.MethodPost, "/jobs/"+id+"/cancel", "",
		map[string]string{"Content-Type": "application/json; charset=utf-8", "Origin": hs.URL}, "{}")
	var d struct{ State string }
	if err := json.Unmarshal([]byte(body), &d); code != http.StatusOK || err != nil || d.State != string(jobmanager.StateCanceled) {
		t.Fatalf("JSON POST cancel: %d %s, want 200 CANCELED", code, body)
	}
}
