package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/internal/proctest"
)

// selfSigned writes a certificate for 127.0.0.1 and its key; the
// certificate is its own CA.
func selfSigned(t *testing.T, dir string) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "weir-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// A job manager bound beyond loopback refuses to start without a token.
// With a token and TLS, a task manager and the client commands that give
// both get in; a client without the token, or without TLS, is refused
// with a clear error, and a plaintext client is told to give --tls or
// --tls-ca.
func TestJobManagerBeyondLoopbackRequiresATokenAndServesTLS(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(streamctlBin, "jobmanager", "--listen", "0.0.0.0:0", "--http", "127.0.0.1:0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "needs --auth-token-file") {
		t.Fatalf("jobmanager on 0.0.0.0 without a token: %q, %v; want a refusal", out, err)
	}

	dir := t.TempDir()
	cert, key := selfSigned(t, dir)
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	jm := proctest.Start(t, exec.Command(streamctlBin, "jobmanager", "--listen", "0.0.0.0:0", "--http", "127.0.0.1:0",
		"--auth-token-file", token, "--tls-cert", cert, "--tls-key", key))
	_, port, err := net.SplitHostPort(jm.Line(t, `^jobmanager listening on (\S+)$`))
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + port
	jm.Line(t, `^jobmanager http on (\S+)$`)
	wrong := filepath.Join(dir, "wrong")
	if err := os.WriteFile(wrong, []byte("guess"), 0o600); err != nil {
		t.Fatal(err)
	}
	secure := []string{"--jobmanager", addr, "--auth-token-file", token, "--tls-ca", cert}
	tm := proctest.Start(t, exec.Command(streamctlBin, append([]string{"taskmanager", "--id", "tm-a"}, secure...)...))

	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := exec.Command(streamctlBin, append([]string{"list", "--output", "json"}, secure...)...).CombinedOutput()
		if err == nil && strings.TrimSpace(string(out)) == "[]" && strings.Contains(jm.Stderr.String(), `"task_manager": "tm-a"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("list with token and TLS: %q, %v; job manager stderr:\n%s\ntask manager stderr:\n%s", out, err, jm.Stderr.Tail(20), tm.Stderr.Tail(20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no token", []string{"--jobmanager", addr, "--tls-ca", cert}, "refused the call"},
		{"wrong token", []string{"--jobmanager", addr, "--tls-ca", cert, "--auth-token-file", wrong}, "refused the call"},
		{"no TLS", []string{"--jobmanager", addr, "--auth-token-file", token}, "unreachable"},
		{"no TLS is told to give --tls", []string{"--jobmanager", addr, "--auth-token-file", token}, "it may serve TLS: give --tls or --tls-ca"},
	} {
		out, err := exec.Command(streamctlBin, append([]string{"list"}, tc.args...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("%s: %q, %v; want an error containing %q", tc.name, out, err, tc.want)
		}
	}
	tm.Stop(t)
	jm.Stop(t)
}

// With --log-format json every line a job manager writes to stderr is a
// JSON object, also what the standard library logs: a plaintext HTTP
// request and a plaintext gRPC client against its TLS listeners make
// net/http log a TLS handshake error, which must come through zap.
func TestJSONLogFormatWritesOnlyJSONLinesToStderr(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cert, key := selfSigned(t, dir)
	jm := proctest.Start(t, exec.Command(streamctlBin, "--log-format", "json", "jobmanager", "--listen", "127.0.0.1:0",
		"--http", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "jm"), "--tls-cert", cert, "--tls-key", key))
	addr := jm.Line(t, `^jobmanager listening on (\S+)$`)
	httpAddr := jm.Line(t, `^jobmanager http on (\S+)$`)
	if resp, err := http.Get("http://" + httpAddr + "/jobs"); err == nil {
		_ = resp.Body.Close()
	}
	if out, err := exec.Command(streamctlBin, "list", "--jobmanager", addr).CombinedOutput(); err == nil {
		t.Fatalf("plaintext list against a TLS job manager: %q, want an error", out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(jm.Stderr.String(), "TLS handshake error") {
		if time.Now().After(deadline) {
			t.Fatalf("no TLS handshake error logged within 30s; stderr:\n%s", jm.Stderr.Tail(20))
		}
		time.Sleep(50 * time.Millisecond)
	}
	jm.Stop(t)
	lines := strings.Split(strings.TrimSuffix(jm.Stderr.String(), "\n"), "\n")
	for i, l := range lines {
		var obj map[string]any
		if err := json.Unmarshal([]byte(l), &obj); err != nil {
			t.Errorf("stderr line %d is not JSON (%v): %q", i+1, err, l)
		}
	}
	t.Logf("%d stderr lines checked", len(lines))
}
