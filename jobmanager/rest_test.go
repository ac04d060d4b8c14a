package jobmanager

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/weirstream/weir/internal/rpc"
)

// With a token, every HTTP endpoint refuses a request without it (401)
// and serves one that carries it.
func TestHTTPRequiresTheToken(t *testing.T) {
	srv, err := New(AuthToken("s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	hs := httptest.NewServer(srv.HTTPHandler())
	defer hs.Close()
	for _, tc := range []struct {
		path, auth string
		code       int
		body       string
	}{
		{"/jobs", "", http.StatusUnauthorized, ""},
		{"/metrics", "", http.StatusUnauthorized, ""},
		{"/taskmanagers", "Bearer wrong", http.StatusUnauthorized, ""},
		{"/jobs", "Bearer s3cret", http.StatusOK, `{"jobs":[]}`},
		// The scheme is case-insensitive (RFC 7235); the token is not.
		{"/jobs", "bearer s3cret", http.StatusOK, `{"jobs":[]}`},
		{"/jobs", "BEARER s3cret", http.StatusOK, `{"jobs":[]}`},
		{"/jobs", "bearer S3CRET", http.StatusUnauthorized, ""},
		{"/jobs/overview", "Bearer s3cret", http.StatusOK, `{"jobs":[]}`},
		{"/taskmanagers", "Bearer s3cret", http.StatusOK, `{"taskmanagers":[]}`},
		{"/metrics", "Bearer s3cret", http.StatusOK, "weir_jobmanager_taskSlotsTotal 0"},
		{"/jobs/0123456789abcdef0123456789abcdef", "Bearer s3cret", http.StatusNotFound, `{"errors":[`},
		// The dashboard's files hold no data: served without the token
		// (the page's API calls carry it).
		{"/", "", http.StatusOK, `<script src="/static/app.js">`},
		{"/static/app.js", "", http.StatusOK, `api("/jobs/overview")`},
		{"/static/missing.js", "", http.StatusNotFound, ""},
		{"/index.html", "", http.StatusUnauthorized, ""},
		// Readiness tells only whether this job manager serves the API:
		// a probe cannot carry the token.
		{"/readyz", "", http.StatusOK, `{"leading":true}`},
	} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, hs.URL+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || !strings.Contains(string(b), tc.body) {
			t.Errorf("GET %s (%q): %d %q, want %d with %q", tc.path, tc.auth, resp.StatusCode, b, tc.code, tc.body)
		}
	}
}

// A REST cancel waits up to cancelTimeout: the HTTP server's write timeout
// must leave it time to answer.
func TestTheHTTPWriteTimeoutOutlastsACancel(t *testing.T) {
	if cancelTimeout >= rpc.HTTPWriteTimeout {
		t.Fatalf("cancel waits up to %v, the HTTP server answers within %v", cancelTimeout, rpc.HTTPWriteTimeout)
	}
}

// PATCH /jobs/{id}?mode=cancel answers as Flink's does for a job that
// already ended: 202 again for a cancelled one, 409 with Flink's error body
// for one that finished or failed, 404 for an unknown one.
func TestPatchCancelOfAnEndedJob(t *testing.T) {
	srv, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for _, st := range []JobState{StateCanceled, StateFinished, StateFailed} {
		if err := srv.jobs.store.Put(JobRecord{ID: "job-" + string(st), Type: "numbers", State: st}); err != nil {
			t.Fatal(err)
		}
	}
	hs := httptest.NewServer(srv.HTTPHandler())
	defer hs.Close()
	for _, tc := range []struct {
		id   string
		code int
		body string
	}{
		{"job-CANCELED", http.StatusAccepted, "{}"},
		{"job-FINISHED", http.StatusConflict, `{"errors":[`},
		{"job-FAILED", http.StatusConflict, `{"errors":[`},
		{"nosuchjob", http.StatusNotFound, `{"errors":[`},
	} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPatch, hs.URL+"/jobs/"+tc.id+"?mode=cancel", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || !strings.HasPrefix(string(b), tc.body) {
			t.Errorf("PATCH /jobs/%s?mode=cancel: %d %s, want %d %s", tc.id, resp.StatusCode, b, tc.code, tc.body)
		}
	}
}
