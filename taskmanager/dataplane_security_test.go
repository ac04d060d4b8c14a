package taskmanager_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/weirstream/weir/taskmanager"
)

// rawHeader is a data-plane frame header: kind, channel, length.
func rawHeader(kind byte, ch, n uint32) []byte {
	return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32([]byte{kind}, ch), n)
}

// strangerSends connects to addr without any secret, writes b and returns once the receiver closed the connection
// (an error if it did not within 30 s, which bounds a failure).
func strangerSends(t *testing.T, addr string, b []byte) error {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	rd := bufio.NewReader(conn)
	_, _ = conn.Write(b) // the receiver may close before reading it all
	if n, err := rd.Discard(1 << 20); !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !strings.Contains(fmt.Sprint(err), "reset") {
		return fmt.Errorf("after %d bytes the connection is still open: %w", n, err)
	}
	return nil
}

// sendAll sends records rec-0..rec-(n-1) and the end of stream on ch.
func sendAll(ctx context.Context, snd *taskmanager.Sender, ch uint32, n int) error {
	for i := range n {
		if err := snd.Send(ctx, ch, taskmanager.Frame{Kind: taskmanager.FrameData, Payload: []byte("rec-" + strconv.Itoa(i))}); err != nil {
			return err
		}
	}
	return snd.Send(ctx, ch, taskmanager.Frame{Kind: taskmanager.FrameEOS})
}

// recvAll checks that ch carries exactly rec-0..rec-(n-1), then the end
// of stream.
func recvAll(t *testing.T, rcv *taskmanager.Receiver, ch uint32, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // bounds a failure, never a success
	defer cancel()
	for i := range n {
		f, err := rcv.Recv(ctx, ch)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if want := "rec-" + strconv.Itoa(i); f.Kind != taskmanager.FrameData || string(f.Payload) != want {
			t.Fatalf("record %d of channel %d is %q (kind %d), want %q", i, ch, f.Payload, f.Kind, want)
		}
	}
	if f, err := rcv.Recv(ctx, ch); err != nil || f.Kind != taskmanager.FrameEOS {
		t.Fatalf("after %d records: %v, %v; want the end of stream", n, f, err)
	}
}

// A peer that cannot prove it belongs to the receiver's attempt (a wrong
// secret, a stale attempt, a stranger speaking the protocol without the
// secret, or any bytes at all, such as a header announcing 64 MiB, which
// is refused from its header without allocating it) is refused, the
// refusal logged with its reason; the attempt's own sender's records all
// arrive, in order, and nothing else does.
func TestDataPlaneRefusesPeersThatCannotProveTheAttempt(t *testing.T) {
	id := taskmanager.AttemptID{Job: "job", Attempt: 2}
	begin := append(rawHeader(9, 0, 32), make([]byte, 32)...) // a nonce
	hello := binary.BigEndian.AppendUint32(nil, uint32(id.Attempt))
	hello = append(append(hello, make([]byte, 32)...), id.Job...) // a MAC of zeros
	cases := []struct {
		name   string
		dial   func(t *testing.T, addr string) error
		reason string
	}{
		{"wrong secret", func(t *testing.T, addr string) error {
			_, err := taskmanager.DialData(t.Context(), addr, id, []byte("another secret of 32 bytes......"))
			return err
		}, "wrong proof"},
		{"stale attempt", func(t *testing.T, addr string) error {
			_, err := taskmanager.DialData(t.Context(), addr, taskmanager.AttemptID{Job: "job", Attempt: 1}, secret)
			return err
		}, "sender of job/1"},
		{"forged proof", func(t *testing.T, addr string) error {
			return strangerSends(t, addr, append(append(begin, rawHeader(6, 0, uint32(len(hello)))...), hello...))
		}, "wrong proof"},
		{"a frame declaring 64 MiB", func(t *testing.T, addr string) error {
			return strangerSends(t, addr, append(rawHeader(1, 2, 64<<20), make([]byte, 1<<16)...))
		}, "frame too large"},
		{"a malformed 10-byte frame", func(t *testing.T, addr string) error {
			return strangerSends(t, addr, append(rawHeader(1, 2, 1), 9))
		}, "want the sender's nonce"},
		{"an open on a live channel", func(t *testing.T, addr string) error {
			return strangerSends(t, addr, append(begin, rawHeader(4, 2, 0)...))
		}, "want the sender's proof"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			const ch, n = 2, 50
			core, logs := observer.New(zap.WarnLevel)
			rcv, addr := serveReceiver(t, 4, id, zap.New(core), ch)
			ctx := t.Context()
			snd, err := taskmanager.DialData(ctx, addr, id, secret)
			if err != nil {
				t.Fatal(err)
			}
			defer snd.Close()
			if err := snd.Open(ch); err != nil {
				t.Fatal(err)
			}
			sent := make(chan error, 1)
			go func() { sent <- sendAll(ctx, snd, ch, n) }()

			err = tc.dial(t, addr)
			if errors.Is(err, taskmanager.ErrNotAuthenticated) {
				err = nil // DialData's refusal
			}
			if err != nil {
				t.Fatalf("the peer was not refused: %v", err)
			}
			recvAll(t, rcv, ch, n)
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
			refused := logs.FilterMessage("request refused").All()
			if len(refused) != 1 {
				t.Fatalf("%d refusals logged, want 1: %v", len(refused), logs.All())
			}
			if reason := fmt.Sprint(refused[0].ContextMap()["reason"]); !strings.Contains(reason, tc.reason) {
				t.Fatalf("refusal logged with reason %q, want it to say %q", reason, tc.reason)
			}
		})
	}
}

// A proven sender may open only the channels the deployment declared, and
// each once: an open of an undeclared channel, or of a channel another
// sender opened (which would take its credits), closes the offending
// connection; the channel's own sender's records all arrive, and an
// undeclared channel has no buffer to receive on.
func TestDataPlaneOpensOnlyDeclaredChannelsAndEachOnce(t *testing.T) {
	id := taskmanager.AttemptID{Job: "job", Attempt: 1}
	for _, tc := range []struct {
		name string
		ch   uint32
	}{{"undeclared channel", 99}, {"live channel", 3}} {
		t.Run(tc.name, func(t *testing.T) {
			const ch, n = 3, 50
			core, logs := observer.New(zap.WarnLevel)
			rcv, addr := serveReceiver(t, 4, id, zap.New(core), ch)
			ctx := t.Context()
			snd, err := taskmanager.DialData(ctx, addr, id, secret)
			if err != nil {
				t.Fatal(err)
			}
			defer snd.Close()
			if err := snd.Open(ch); err != nil {
				t.Fatal(err)
			}
			if err := snd.Send(ctx, ch, taskmanager.Frame{Kind: taskmanager.FrameData, Payload: []byte("rec-0")}); err != nil {
				t.Fatal(err)
			}
			other, err := taskmanager.DialData(ctx, addr, id, secret)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			_ = other.Open(tc.ch)
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second) // bounds a failure, never a success
			defer cancel()
			err = sendAll(sctx, other, tc.ch, 1)
			if err == nil || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("the second sender sent on channel %d: %v", tc.ch, err)
			}
			go func() {
				for i := 1; i < n; i++ {
					_ = snd.Send(ctx, ch, taskmanager.Frame{Kind: taskmanager.FrameData, Payload: []byte("rec-" + strconv.Itoa(i))})
				}
				_ = snd.Send(ctx, ch, taskmanager.Frame{Kind: taskmanager.FrameEOS})
			}()
			recvAll(t, rcv, ch, n)
			if _, err := rcv.Recv(ctx, 99); !errors.Is(err, taskmanager.ErrUndeclaredChannel) {
				t.Fatalf("Recv of an undeclared channel: %v, want ErrUndeclaredChannel", err)
			}
			if broke := logs.FilterMessage("data-plane sender broke the protocol; its connection is closed").All(); len(broke) != 1 {
				t.Fatalf("%d protocol violations logged, want 1: %v", len(broke), logs.All())
			}
		})
	}
}

// With DataTLS on both ends, records travel over TLS; a plaintext sender,
// or a TLS sender with the wrong secret, is refused.
func TestDataPlaneOverTLSRefusesPlaintextAndWrongSecrets(t *testing.T) {
	cert, err := taskmanager.NewDataCertificate()
	if err != nil {
		t.Fatal(err)
	}
	id := taskmanager.AttemptID{Job: "job", Attempt: 1}
	const ch, n = 1, 50
	core, logs := observer.New(zap.WarnLevel)
	rcv, addr := serveReceiverWith(t, 4, id, []uint32{ch}, taskmanager.DataLogger(zap.New(core)), taskmanager.DataTLS(cert))
	ctx := t.Context()
	if _, err := taskmanager.DialData(ctx, addr, id, secret); err == nil {
		t.Fatal("a plaintext sender connected to a TLS receiver")
	}
	if _, err := taskmanager.DialData(ctx, addr, id, []byte("another secret of 32 bytes......"), taskmanager.DataTLS(cert)); !errors.Is(err, taskmanager.ErrNotAuthenticated) {
		t.Fatalf("a TLS sender with the wrong secret: %v, want ErrNotAuthenticated", err)
	}
	snd, err := taskmanager.DialData(ctx, addr, id, secret, taskmanager.DataTLS(cert))
	if err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
	if err := snd.Open(ch); err != nil {
		t.Fatal(err)
	}
	sent := make(chan error, 1)
	go func() { sent <- sendAll(ctx, snd, ch, n) }()
	recvAll(t, rcv, ch, n)
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if refused := logs.FilterMessage("request refused").All(); len(refused) != 1 { // one source, rate-limited
		t.Fatalf("%d refusals logged, want 1 (both refused peers came from one host): %v", len(refused), logs.All())
	}
}
