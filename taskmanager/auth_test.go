package taskmanager_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"

	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/taskmanager"
)

// A task manager whose token the job manager refuses does not retry at its
// reconnect rate for ever: it backs off, doubling the pause at every
// refusal, and logs the refusal (with its cause) once per attempt.
func TestARefusedTokenBacksOffExponentially(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(rpc.ServerOptions(nil, "s3cret")...)
	weirpb.RegisterJobManagerServer(gs, &fakeJM{regs: make(chan string, 10)})
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)

	const base = 5 * time.Millisecond
	const n = 6
	core, logs := observer.New(zapcore.WarnLevel)
	refused := make(chan struct{}, 100)
	log := zap.New(core, zap.Hooks(func(e zapcore.Entry) error {
		if strings.Contains(e.Message, "refused the auth token") {
			refused <- struct{}{}
		}
		return nil
	}))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- taskmanager.Run(ctx, lis.Addr().String(), taskmanager.ID("tm-a"), taskmanager.AuthToken("wrong"),
			taskmanager.ReconnectDelay(base), taskmanager.Logger(log))
	}()
	for i := range n {
		select {
		case <-refused:
		case <-time.After(30 * time.Second):
			t.Fatalf("%d refusals logged in 30s, want %d: %v", i, n, logs.All())
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v, want context.Canceled", err)
	}
	entries := logs.FilterMessageSnippet("refused the auth token").All()
	if len(logs.All()) != len(entries) {
		t.Fatalf("other warnings besides the refusals: %v", logs.All())
	}
	want := base
	for i, e := range entries[:n] {
		f := e.ContextMap()
		if d, _ := f["delay"].(time.Duration); d != want {
			t.Errorf("refusal %d: pause %v, want %v", i+1, f["delay"], want)
		}
		if !strings.Contains(f["error"].(string), "Unauthenticated") {
			t.Errorf("refusal %d: error %q does not give the cause", i+1, f["error"])
		}
		want *= 2
	}
}
