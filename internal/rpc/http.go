package rpc

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"mime"
	"net"
	"net/http"
	"strings"
	"time"
)

// Weir's HTTP endpoints (the job manager's REST API and dashboard, the task
// managers' /metrics; docs/guide/security.md) share one server setup and
// one guard against browsers:
//   - NewHTTPServer bounds how long a request may take to arrive and to be
//     answered, and how long an idle connection is kept;
//   - BrowserGuard answers only requests whose Host header names this
//     server (DNS rebinding: a web page whose name resolves to 127.0.0.1
//     sends its own name), and refuses a state-changing request a browser
//     would send cross-site without asking (a "simple" request: a form,
//     or fetch with text/plain).

// Timeouts of every HTTP server NewHTTPServer makes.
const (
	// HTTPReadHeaderTimeout bounds the arrival of a request's headers.
	HTTPReadHeaderTimeout = 5 * time.Second
	// HTTPReadTimeout bounds the arrival of a whole request (Weir's
	// requests have no or tiny bodies).
	HTTPReadTimeout = 30 * time.Second
	// HTTPWriteTimeout bounds a request from its headers to the end of its
	// answer. It is above the longest request Weir serves: a REST cancel
	// waits up to a minute for the job's tasks to stop. No endpoint
	// streams.
	HTTPWriteTimeout = 2 * time.Minute
	// HTTPIdleTimeout closes a kept-alive connection idle for that long.
	HTTPIdleTimeout = time.Minute
	// httpMaxHeaderBytes bounds a request's headers.
	httpMaxHeaderBytes = 64 << 10
)

// HTTPOpt configures NewHTTPServer.
type HTTPOpt interface{ apply(*httpCfg) }

type httpCfg struct {
	tls  *tls.Config
	idle time.Duration
}

type httpOpt func(*httpCfg)

func (o httpOpt) apply(c *httpCfg) { o(c) }

// HTTPTLS serves with cfg (call ServeTLS with empty file names).
func HTTPTLS(cfg *tls.Config) HTTPOpt { return httpOpt(func(c *httpCfg) { c.tls = cfg }) }

// HTTPIdle sets how long an idle connection is kept (default
// HTTPIdleTimeout).
func HTTPIdle(d time.Duration) HTTPOpt { return httpOpt(func(c *httpCfg) { c.idle = d }) }

// NewHTTPServer returns the http.Server of every Weir HTTP endpoint: h with
// the timeouts above.
func NewHTTPServer(h http.Handler, opts ...HTTPOpt) *http.Server {
	c := httpCfg{idle: HTTPIdleTimeout}
	for _, o := range opts {
		o.apply(&c)
	}
	return &http.Server{Handler: h, TLSConfig: c.tls, MaxHeaderBytes: httpMaxHeaderBytes,
		ReadHeaderTimeout: HTTPReadHeaderTimeout, ReadTimeout: HTTPReadTimeout, WriteTimeout: HTTPWriteTimeout, IdleTimeout: c.idle}
}

// RequestHeader is the header a non-browser client (a script, curl) sets on
// a state-changing request instead of Content-Type: application/json; any
// value will do. A browser cannot send it cross-site without a CORS
// preflight, which Weir never grants.
const RequestHeader = "X-Weir-Request"

// BrowserGuard wraps h so that it only sees requests a browser page could
// not have forged, refusing the others (logged to LogRejections):
//   - 421 Misdirected Request unless the Host header's name is "localhost"
//     (or ends in ".localhost"), a loopback address, or one of hosts (the
//     listen host and the configured names; case-insensitive, the port
//     ignored). A host "", "0.0.0.0" or "::" (a server on every interface)
//     allows any IP address: DNS rebinding needs a name.
//   - 403 Forbidden for a POST, PUT, PATCH or DELETE that carries neither
//     Content-Type: application/json nor RequestHeader.
//
// The answers have Flink's error body, {"errors": [...]}.
func BrowserGuard(hosts []string, h http.Handler, opts ...AuthOpt) http.Handler {
	var ac authCfg
	for _, o := range opts {
		o.apply(&ac)
	}
	allowed := map[string]bool{}
	anyIP := false
	for _, name := range hosts {
		name = hostName(name)
		if ip := net.ParseIP(name); name == "" || (ip != nil && ip.IsUnspecified()) {
			anyIP = true
			continue
		}
		allowed[name] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name := hostName(r.Host); !allowedHost(name, allowed, anyIP) {
			refuseHTTP(w, r, ac.rejects, http.StatusMisdirectedRequest,
				fmt.Sprintf("Host %q is not a name of this server (see --rest-allowed-hosts)", r.Host))
			return
		}
		if stateChanging(r.Method) && !nonSimple(r) {
			refuseHTTP(w, r, ac.rejects, http.StatusForbidden,
				"a state-changing request needs Content-Type: application/json or the "+RequestHeader+" header")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// hostName is the lower-case name of a Host header or a listen address,
// without port, brackets or trailing dot.
func hostName(hostport string) string {
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	return strings.ToLower(strings.TrimSuffix(h, "."))
}

func allowedHost(name string, allowed map[string]bool, anyIP bool) bool {
	if name == "" {
		return false
	}
	if allowed[name] || isLoopbackHost(name) {
		return true
	}
	return anyIP && net.ParseIP(name) != nil
}

// isLoopbackHost reports whether host (no port) is "localhost", a name
// under ".localhost" (RFC 6761: always loopback) or a loopback address.
func isLoopbackHost(host string) bool {
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func stateChanging(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return true
}

// nonSimple reports whether r is a request no browser sends cross-site
// without a CORS preflight.
func nonSimple(r *http.Request) bool {
	if r.Header.Get(RequestHeader) != "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && mt == "application/json"
}

// refuseHTTP answers code with Flink's error body and logs the refusal.
func refuseHTTP(w http.ResponseWriter, r *http.Request, rejects *RejectLog, code int, reason string) {
	rejects.Rejected(r.RemoteAddr, r.Method+" "+r.URL.Path, reason)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string][]string{"errors": {reason}})
}
