package taskmanager_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/weirstream/weir/taskmanager"
)

// A channel carries data, barriers and the end of the stream in order; the
// sender blocks once it has used the receiver's window of credits and goes
// on when the receiver takes a frame out.
func TestDataPlaneCreditsBoundInFlightFramesAndKeepBarriersInBand(t *testing.T) {
	const window = 4
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	rcv := taskmanager.NewReceiver(window)
	served := make(chan error, 1)
	go func() { served <- rcv.Serve(ctx, lis) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()
	snd, err := taskmanager.DialData(ctx, lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
	const ch = 7
	if err := snd.Open(ch); err != nil {
		t.Fatal(err)
	}
	frames := []taskmanager.Frame{
		{Kind: taskmanager.FrameData, Payload: []byte("a")},
		{Kind: taskmanager.FrameBarrier, Payload: []byte{1}},
		{Kind: taskmanager.FrameData, Payload: []byte("b")},
		{Kind: taskmanager.FrameData, Payload: []byte("c")},
	}
	for _, f := range frames {
		if err := snd.Send(ctx, ch, f); err != nil {
			t.Fatal(err)
		}
	}
	// The window is used up: the next send waits.
	bctx, bcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err = snd.Send(bctx, ch, taskmanager.Frame{Kind: taskmanager.FrameEOS})
	bcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("send beyond the window: %v, want it to block", err)
	}
	got, err := rcv.Recv(ctx, ch)
	if err != nil || string(got.Payload) != "a" {
		t.Fatalf("first frame %v, %v", got, err)
	}
	if err := snd.Send(ctx, ch, taskmanager.Frame{Kind: taskmanager.FrameEOS}); err != nil {
		t.Fatalf("send after a credit came back: %v", err)
	}
	want := append(frames[1:], taskmanager.Frame{Kind: taskmanager.FrameEOS})
	for i, w := range want {
		f, err := rcv.Recv(ctx, ch)
		if err != nil {
			t.Fatal(err)
		}
		if f.Kind != w.Kind || string(f.Payload) != string(w.Payload) {
			t.Fatalf("frame %d = %v, want %v", i+1, f, w)
		}
	}
}
