package rpc_test

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
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
	if e.Level != zapcore.WarnLevel || e.Message != "authentication refused" || f["reason"] != "wrong token" ||
		f["request"] != "/weir.rpc.v1.JobManager/GetJob" || !strings.HasPrefix(fmt.Sprint(f["peer"]), "127.0.0.1:") {
		t.Fatalf("logged %s %q %v", e.Level, e.Message, f)
	}
	if s := fmt.Sprint(e.Message, f); strings.Contains(s, bad) || strings.Contains(s, "s3cret") {
		t.Fatalf("a token was logged: %s", s)
	}
}
