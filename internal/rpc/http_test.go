package rpc_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/weirstream/weir/internal/rpc"
)

// BrowserGuard answers a request only if its Host names the server and, if
// it changes state, it is not a request a web page sends cross-site
// without a CORS preflight.
func TestBrowserGuardChecksHostAndRefusesSimpleStateChangingRequests(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	for _, tc := range []struct {
		name        string
		hosts       []string
		method      string
		host        string
		contentType string
		custom      string
		want        int
	}{
		{"loopback IP", nil, "GET", "127.0.0.1:8081", "", "", http.StatusNoContent},
		{"other loopback IP", nil, "GET", "127.0.0.2:8081", "", "", http.StatusNoContent},
		{"IPv6 loopback", nil, "GET", "[::1]:8081", "", "", http.StatusNoContent},
		{"localhost", nil, "GET", "localhost:8081", "", "", http.StatusNoContent},
		{"localhost upper case, trailing dot", nil, "GET", "LOCALHOST.:8081", "", "", http.StatusNoContent},
		{"a .localhost name", nil, "GET", "weir.localhost", "", "", http.StatusNoContent},
		{"rebinding name", nil, "GET", "attacker.example:8081", "", "", http.StatusMisdirectedRequest},
		{"localhost as a prefix", nil, "GET", "localhost.attacker.example", "", "", http.StatusMisdirectedRequest},
		{"no Host", nil, "GET", "", "", "", http.StatusMisdirectedRequest},
		{"configured name", []string{"jm.example.com"}, "GET", "JM.example.com:443", "", "", http.StatusNoContent},
		{"listen IP", []string{"10.1.2.3:8081"}, "GET", "10.1.2.3:8081", "", "", http.StatusNoContent},
		{"another IP", []string{"10.1.2.3:8081"}, "GET", "10.9.9.9:8081", "", "", http.StatusMisdirectedRequest},
		{"any IP on every interface", []string{"0.0.0.0:8081"}, "GET", "10.9.9.9:8081", "", "", http.StatusNoContent},
		{"but no name on every interface", []string{"0.0.0.0:8081"}, "GET", "attacker.example", "", "", http.StatusMisdirectedRequest},
		{"JSON POST", nil, "POST", "127.0.0.1", "application/json", "", http.StatusNoContent},
		{"JSON POST with charset", nil, "POST", "127.0.0.1", "Application/JSON; charset=utf-8", "", http.StatusNoContent},
		{"POST with the custom header", nil, "POST", "127.0.0.1", "", "1", http.StatusNoContent},
		{"text/plain POST", nil, "POST", "127.0.0.1", "text/plain", "", http.StatusForbidden},
		{"form POST", nil, "POST", "127.0.0.1", "application/x-www-form-urlencoded", "", http.StatusForbidden},
		{"multipart POST", nil, "POST", "127.0.0.1", "multipart/form-data; boundary=b", "", http.StatusForbidden},
		{"bare POST", nil, "POST", "127.0.0.1", "", "", http.StatusForbidden},
		{"bare PATCH", nil, "PATCH", "127.0.0.1", "", "", http.StatusForbidden},
		{"bare PUT", nil, "PUT", "127.0.0.1", "", "", http.StatusForbidden},
		{"bare DELETE", nil, "DELETE", "127.0.0.1", "", "", http.StatusForbidden},
		{"JSON DELETE", nil, "DELETE", "127.0.0.1", "application/json", "", http.StatusNoContent},
		{"HEAD", nil, "HEAD", "127.0.0.1", "", "", http.StatusNoContent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.DebugLevel)
			h := rpc.BrowserGuard(tc.hosts, ok, rpc.LogRejections(rpc.NewRejectLog(zap.New(core), time.Hour)))
			req := httptest.NewRequestWithContext(t.Context(), tc.method, "/jobs/x/cancel", nil)
			req.Host = tc.host
			if tc.contentType != "" {
				req.Header.Set("Content-Type", tc.contentType)
			}
			if tc.custom != "" {
				req.Header.Set(rpc.RequestHeader, tc.custom)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.want {
				t.Fatalf("%s Host %q Content-Type %q: %d %s, want %d", tc.method, tc.host, tc.contentType, rec.Code, rec.Body, tc.want)
			}
			refused := tc.want != http.StatusNoContent
			if got := len(logs.All()); (got == 1) != refused || got > 1 {
				t.Fatalf("%d log entries, want %d", got, map[bool]int{true: 1}[refused])
			}
			if refused {
				if f := logs.All()[0].ContextMap(); f["reason"] == "" || f["request"] != tc.method+" /jobs/x/cancel" {
					t.Fatalf("logged %v, want the request and the reason", f)
				}
			}
		})
	}
}

// Case 7 of issue 31: a kept-alive HTTP connection that stays idle is
// closed by the server after the idle timeout, instead of being kept for
// ever.
func TestAnIdleHTTPConnectionIsClosedAfterTheIdleTimeout(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := rpc.NewHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }),
		rpc.HTTPIdle(100*time.Millisecond))
	served := make(chan error, 1)
	go func() { served <- hs.Serve(lis) }()
	t.Cleanup(func() {
		_ = hs.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Error(err)
		}
	})
	conn, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "ok" || resp.Close {
		t.Fatalf("first request: %d %q (close %v), want a kept-alive 200", resp.StatusCode, body, resp.Close)
	}
	// Idle now. A generous deadline only keeps a broken server from hanging
	// the test: the server must close the connection, the test must not.
	if err := conn.SetReadDeadline(time.Now().Add(60 * time.Second)); err != nil {
		t.Fatal(err)
	}
	n, err := r.Read(make([]byte, 1))
	if !errors.Is(err, io.EOF) {
		t.Fatalf("idle connection: read %d bytes, %v; want EOF (closed by the server)", n, err)
	}
}

// Every server NewHTTPServer makes bounds the arrival of a request, its
// answer and idle connections; the write bound is above the longest
// request Weir serves (a REST cancel waits up to a minute).
func TestHTTPServersHaveEveryTimeout(t *testing.T) {
	hs := rpc.NewHTTPServer(http.NotFoundHandler())
	for name, d := range map[string]time.Duration{"ReadHeaderTimeout": hs.ReadHeaderTimeout, "ReadTimeout": hs.ReadTimeout,
		"WriteTimeout": hs.WriteTimeout, "IdleTimeout": hs.IdleTimeout} {
		if d <= 0 {
			t.Errorf("%s %v, want a bound", name, d)
		}
	}
	if hs.WriteTimeout <= time.Minute {
		t.Errorf("WriteTimeout %v, want above a minute (a REST cancel's wait)", hs.WriteTimeout)
	}
}
