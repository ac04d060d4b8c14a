package taskmanager_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

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
	rcv, err := taskmanager.NewReceiver(window, taskmanager.AttemptID{Job: "job", Attempt: 1}, secret)
	if err != nil {
		t.Fatal(err)
	}
	const ch = 7
	rcv.Expect(ch)
	served := make(chan error, 1)
	go func() { served <- rcv.Serve(ctx, lis) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()
	snd, err := taskmanager.DialData(ctx, lis.Addr().String(), taskmanager.AttemptID{Job: "job", Attempt: 1}, secret)
	if err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
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

// secret is the attempt secret of the tests' data planes.
var secret = []byte("0123456789abcdef0123456789abcdef")

// serveReceiver serves a receiver of attempt id with secret on a new local
// port until the test ends, logging to log, expecting channels chs.
func serveReceiver(t *testing.T, window int, id taskmanager.AttemptID, log *zap.Logger, chs ...uint32) (*taskmanager.Receiver, string) {
	t.Helper()
	return serveReceiverWith(t, window, id, chs, taskmanager.DataLogger(log))
}

// serveReceiverWith is serveReceiver with any options.
func serveReceiverWith(t *testing.T, window int, id taskmanager.AttemptID, chs []uint32, opts ...taskmanager.DataOpt) (*taskmanager.Receiver, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	rcv, err := taskmanager.NewReceiver(window, id, secret, opts...)
	if err != nil {
		t.Fatal(err)
	}
	rcv.Expect(chs...)
	served := make(chan error, 1)
	go func() { served <- rcv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	})
	return rcv, lis.Addr().String()
}

// A sender of another attempt (a stale task manager dialling the address
// of its old peer, the port reused by the new attempt) is refused with a
// log line, and none of its records reach the new attempt: the new
// attempt's channel carries exactly its own sender's records, in order.
func TestADataPlaneSenderOfAnotherAttemptIsRefused(t *testing.T) {
	for _, stale := range []taskmanager.AttemptID{{Job: "job", Attempt: 1}, {Job: "other-job", Attempt: 2}} {
		t.Run(stale.String(), func(t *testing.T) {
			const ch, n = 3, 20
			current := taskmanager.AttemptID{Job: "job", Attempt: 2}
			core, logs := observer.New(zap.WarnLevel)
			rcv, addr := serveReceiver(t, 4, current, zap.New(core), ch)
			ctx := t.Context()

			// Refused, the stale sender never gets a connection.
			if old, err := taskmanager.DialData(ctx, addr, stale, secret); !errors.Is(err, taskmanager.ErrNotAuthenticated) {
				if err == nil {
					old.Close()
				}
				t.Fatalf("the stale sender of %s dialled attempt %s: %v, want ErrNotAuthenticated", stale, current, err)
			}

			cur, err := taskmanager.DialData(ctx, addr, current, secret)
			if err != nil {
				t.Fatal(err)
			}
			defer cur.Close()
			if err := cur.Open(ch); err != nil {
				t.Fatal(err)
			}
			sent := make(chan error, 1)
			go func() {
				for i := range n {
					if err := cur.Send(ctx, ch, taskmanager.Frame{Kind: taskmanager.FrameData, Payload: []byte("rec-" + strconv.Itoa(i))}); err != nil {
						sent <- err
						return
					}
				}
				sent <- cur.Send(ctx, ch, taskmanager.Frame{Kind: taskmanager.FrameEOS})
			}()
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second) // bounds a failure, never a success
			defer cancel()
			for i := range n {
				f, err := rcv.Recv(rctx, ch)
				if err != nil {
					t.Fatalf("record %d: %v", i, err)
				}
				if want := "rec-" + strconv.Itoa(i); f.Kind != taskmanager.FrameData || string(f.Payload) != want {
					t.Fatalf("record %d of the channel is %q (kind %d), want %q", i, f.Payload, f.Kind, want)
				}
			}
			if f, err := rcv.Recv(rctx, ch); err != nil || f.Kind != taskmanager.FrameEOS {
				t.Fatalf("after %d records: %v, %v; want the end of stream", n, f, err)
			}
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
			refused := logs.FilterMessage("request refused").All()
			if len(refused) != 1 {
				t.Fatalf("%d refusals logged, want 1: %v", len(refused), logs.All())
			}
			if msg := refused[0].ContextMap()["reason"]; !strings.Contains(fmt.Sprint(msg), stale.String()) {
				t.Fatalf("the refusal does not name the stale attempt %s: %v", stale, msg)
			}
		})
	}
}

// A channel whose connection breaks before its end of stream (the sender's
// process died, or keepalive found its host gone) is seen by the receiving
// task: Recv hands out the frames that came, then fails with
// ErrConnectionLost instead of waiting for ever.
func TestARecvSeesTheLossOfItsChannelsConnection(t *testing.T) {
	const ch = 5
	id := taskmanager.AttemptID{Job: "job", Attempt: 1}
	rcv, addr := serveReceiver(t, 8, id, zap.NewNop(), ch)
	ctx := t.Context()
	snd, err := taskmanager.DialData(ctx, addr, id, secret)
	if err != nil {
		t.Fatal(err)
	}
	if err := snd.Open(ch); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a", "b"} {
		if err := snd.Send(ctx, ch, taskmanager.Frame{Kind: taskmanager.FrameData, Payload: []byte(p)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := snd.Close(); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second) // bounds a failure, never a success
	defer cancel()
	for _, want := range []string{"a", "b"} {
		if f, err := rcv.Recv(rctx, ch); err != nil || string(f.Payload) != want {
			t.Fatalf("Recv = %q, %v; want %q", f.Payload, err, want)
		}
	}
	if _, err := rcv.Recv(rctx, ch); !errors.Is(err, taskmanager.ErrConnectionLost) {
		t.Fatalf("Recv after the connection closed = %v, want ErrConnectionLost", err)
	}
}
