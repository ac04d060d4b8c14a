package rpc_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/internal/rpc/weirpb"
)

// serveWithToken serves a job manager that only knows Connect, behind the
// token check, logging refusals to the returned observer.
func serveWithToken(t *testing.T, token string) (string, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(rpc.ServerOptions(nil, token, rpc.LogRejections(rpc.NewRejectLog(zap.New(core), time.Hour)))...)
	weirpb.RegisterJobManagerServer(gs, &fakeJM{})
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String(), logs
}

// The Authorization scheme is case-insensitive (RFC 7235): "bearer" and
// "BEARER" pass the check like "Bearer"; a wrong token or another scheme
// does not.
func TestTheBearerSchemeIsCaseInsensitive(t *testing.T) {
	addr, _ := serveWithToken(t, "s3cret")
	cc, err := rpc.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	client := weirpb.NewJobManagerClient(cc)
	for _, tc := range []struct {
		header string
		want   codes.Code // past the check, the fake answers Unimplemented
	}{
		{"Bearer s3cret", codes.Unimplemented},
		{"bearer s3cret", codes.Unimplemented},
		{"BEARER s3cret", codes.Unimplemented},
		{"bearer wrong", codes.Unauthenticated},
		{"Basic s3cret", codes.Unauthenticated},
		{"s3cret", codes.Unauthenticated},
	} {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", tc.header)
		_, err := client.GetJob(ctx, &weirpb.GetJobRequest{JobId: "x"})
		if got := status.Code(err); got != tc.want {
			t.Errorf("authorization %q: %v, want %v", tc.header, err, tc.want)
		}
	}
}

// A refused call is logged at warn with the peer, the method and why, once
// per peer per interval however often the client retries, and never with
// the token it sent.
func TestRefusedAuthenticationIsLoggedOncePerPeerWithoutTheToken(t *testing.T) {
	addr, logs := serveWithToken(t, "s3cret")
	const bad = "not-the-token-4711"
	cc, err := rpc.Dial(addr, rpc.WithToken(bad))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	client := weirpb.NewJobManagerClient(cc)
	for range 5 {
		if _, err := client.GetJob(t.Context(), &weirpb.GetJobRequest{JobId: "x"}); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("GetJob with a wrong token: %v, want Unauthenticated", err)
		}
	}
	entries := logs.All()
	if len(entries) != 1 {
		t.Fatalf("%d log entries for 5 refusals from one peer, want 1: %v", len(entries), entries)
	}
	e := entries[0]
	f := e.ContextMap()
	if e.Level != zapcore.WarnLevel || e.Message != "request refused" || f["reason"] != "wrong token" ||
		f["request"] != "/weir.rpc.v1.JobManager/GetJob" || !strings.HasPrefix(fmt.Sprint(f["peer"]), "127.0.0.1:") {
		t.Fatalf("logged %s %q %v", e.Level, e.Message, f)
	}
	if s := fmt.Sprint(e.Message, f); strings.Contains(s, bad) || strings.Contains(s, "s3cret") {
		t.Fatalf("a token was logged: %s", s)
	}
}

// h2Conn is a raw HTTP/2 connection to a gRPC server, written frame by
// frame as an attacker would: nothing of grpc's client stands between the
// test and the server.
type h2Conn struct {
	t         *testing.T
	fr        *http2.Framer
	enc       *hpack.Encoder
	hbuf      bytes.Buffer
	authority string
}

func dialH2(t *testing.T, addr string) *h2Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	// A generous bound so that a broken server fails the test instead of
	// hanging it; nothing is asserted about time.
	if err := conn.SetDeadline(time.Now().Add(60 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	c := &h2Conn{t: t, fr: http2.NewFramer(conn, conn), authority: addr}
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.enc = hpack.NewEncoder(&c.hbuf)
	if err := c.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return c
}

// openUnary opens stream id as a call of method whose one message declares
// almost MaxMessageSize bytes and sends only its first bytes: the body is
// never complete. token "" sends no authorization.
func (c *h2Conn) openUnary(id uint32, method, token string) {
	c.t.Helper()
	c.hbuf.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", method}, {":authority", c.authority},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = c.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if token != "" {
		_ = c.enc.WriteField(hpack.HeaderField{Name: "authorization", Value: "Bearer " + token})
	}
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true}); err != nil {
		c.t.Fatal(err)
	}
	msg := make([]byte, 5+100) // the gRPC message prefix, then 100 of the declared bytes
	binary.BigEndian.PutUint32(msg[1:5], rpc.MaxMessageSize-16)
	if err := c.fr.WriteData(id, false, msg); err != nil {
		c.t.Fatal(err)
	}
}

// answers reads frames until the server acknowledges a ping sent now. The
// server handles a connection's frames in order, so by then it has
// answered every stream it was going to answer without more data. It
// returns each stream's grpc-status (from a response's headers) and
// RST_STREAM code, and the server's SETTINGS.
func (c *h2Conn) answers() (statuses map[uint32]string, resets map[uint32]http2.ErrCode, settings map[http2.SettingID]uint32) {
	c.t.Helper()
	ping := [8]byte{'w', 'e', 'i', 'r'}
	if err := c.fr.WritePing(false, ping); err != nil {
		c.t.Fatal(err)
	}
	statuses, resets, settings = map[uint32]string{}, map[uint32]http2.ErrCode{}, map[http2.SettingID]uint32{}
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.t.Fatalf("reading the server's frames: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = f.ForeachSetting(func(s http2.Setting) error { settings[s.ID] = s.Val; return nil })
				_ = c.fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			for _, hf := range f.Fields {
				if hf.Name == "grpc-status" {
					statuses[f.StreamID] = hf.Value
				}
			}
		case *http2.RSTStreamFrame:
			resets[f.StreamID] = f.ErrCode
		case *http2.PingFrame:
			if f.IsAck() && f.Data == ping {
				return statuses, resets, settings
			}
		case *http2.GoAwayFrame:
			c.t.Fatalf("the server closed the connection: %v %s", f.ErrCode, f.DebugData())
		}
	}
}

// Case 5 of issue 31: unauthenticated calls whose one message is never
// complete (a body of almost MaxMessageSize, withheld) are refused as soon
// as their headers arrive, before any body is read: each one is answered
// Unauthenticated while its body is still incomplete, and none occupies a
// stream of the server.
func TestUnauthenticatedCallsAreRefusedBeforeTheirBodiesAreRead(t *testing.T) {
	addr, logs := serveWithToken(t, "s3cret")
	c := dialH2(t, addr)
	const n = 200
	for i := range n {
		c.openUnary(uint32(2*i+1), "/weir.rpc.v1.JobManager/SubmitJob", "")
	}
	statuses, resets, _ := c.answers()
	unauthenticated := strconv.Itoa(int(codes.Unauthenticated))
	for i := range n {
		id := uint32(2*i + 1)
		if statuses[id] != unauthenticated {
			t.Fatalf("stream %d: grpc-status %q (reset %v) while its body is incomplete, want %s: %d of %d streams answered; "+
				"the server waits for the body before it checks the token", id, statuses[id], resets[id], unauthenticated, len(statuses), n)
		}
	}
	if got := len(logs.All()); got != 1 {
		t.Errorf("%d log entries for %d refusals from one peer, want 1", got, n)
	}
}

// An authenticated client holds at most MaxStreamsPerConnection calls open
// on one connection: the server announces the limit, and refuses
// (REFUSED_STREAM) the streams beyond it, whose bodies it never buffers.
func TestConcurrentStreamsPerConnectionAreBounded(t *testing.T) {
	addr, _ := serveWithToken(t, "s3cret")
	c := dialH2(t, addr)
	const n = 2 * rpc.MaxStreamsPerConnection
	for i := range n {
		c.openUnary(uint32(2*i+1), "/weir.rpc.v1.JobManager/SubmitJob", "s3cret")
	}
	statuses, resets, settings := c.answers()
	if got := settings[http2.SettingMaxConcurrentStreams]; got != rpc.MaxStreamsPerConnection {
		t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS %d, want %d", got, rpc.MaxStreamsPerConnection)
	}
	refused := 0
	for i := range n {
		id := uint32(2*i + 1)
		switch {
		case resets[id] == http2.ErrCodeRefusedStream:
			refused++
		case statuses[id] != "" || resets[id] != 0:
			t.Errorf("stream %d: grpc-status %q, reset %v; want it open (its body is incomplete) or refused", id, statuses[id], resets[id])
		}
	}
	if refused != n-rpc.MaxStreamsPerConnection {
		t.Fatalf("%d of %d streams refused, want %d: the server holds more than %d calls open on one connection",
			refused, n, n-rpc.MaxStreamsPerConnection, rpc.MaxStreamsPerConnection)
	}
}
