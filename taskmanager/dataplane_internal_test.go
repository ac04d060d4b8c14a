package taskmanager

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// A frame's length is checked against the limit from its header, before
// anything is allocated for it; a frame announcing much and sending little
// ends at the missing bytes.
func TestReadFrameRefusesAFrameBeyondTheLimitFromItsHeader(t *testing.T) {
	header := func(n uint32) []byte {
		var b bytes.Buffer
		w := bufio.NewWriter(&b)
		_ = writeFrame(w, FrameData, 1, n, nil)
		return b.Bytes()
	}
	cases := []struct {
		name  string
		input []byte
		limit uint32
		want  error
	}{
		{"64 MiB announced, handshake limit", header(64 << 20), maxHandshakeFrame, ErrFrameTooLarge},
		{"one byte beyond the frame limit", header(MaxFrameSize + 1), MaxFrameSize, ErrFrameTooLarge},
		{"64 MiB announced, 10 bytes sent", append(header(64<<20), make([]byte, 10)...), MaxFrameSize, io.ErrUnexpectedEOF},
		{"a whole frame", append(header(3), "abc"...), MaxFrameSize, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, p, _, err := readFrame(bufio.NewReader(bytes.NewReader(tc.input)), tc.limit)
			if !errors.Is(err, tc.want) {
				t.Fatalf("readFrame: %v, want %v", err, tc.want)
			}
			if tc.want == nil && string(p) != "abc" {
				t.Fatalf("payload %q", p)
			}
		})
	}
}

// A receiver granting more credit than a channel's window is a protocol
// violation that ends the sender's connection at once, with no credit of
// that frame granted: the sender does not loop over the 4e9 credits a
// frame can announce.
func TestSenderStopsAtTheFirstCreditBeyondItsWindow(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	s := &Sender{conn: a, w: bufio.NewWriter(a), credits: map[uint32]chan struct{}{}, done: make(chan struct{})}
	go s.readCredits(bufio.NewReader(a))
	s.window(1) // opened
	go func() { _ = writeFrame(bufio.NewWriter(b), frameCredit, 1, 1<<32-1, nil) }()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // bounds a failure, never a success
	defer cancel()
	select {
	case <-s.done:
	case <-ctx.Done():
		t.Fatal("the sender still reads credits after a frame granting 4294967295")
	}
	if !errors.Is(s.err, ErrProtocol) {
		t.Fatalf("sender's error %v, want ErrProtocol", s.err)
	}
	if n := len(s.credits[1]); n != 0 {
		t.Fatalf("%d credits granted from the violating frame, want 0", n)
	}
}

// A message beyond MaxFrameSize is refused by the sender itself, with an
// error saying so, before it waits for a credit or writes anything.
func TestSenderRefusesAMessageBeyondTheFrameLimit(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	s := &Sender{conn: a, w: bufio.NewWriter(a), credits: map[uint32]chan struct{}{}, done: make(chan struct{})}
	go s.readCredits(bufio.NewReader(a))
	defer s.Close()
	err := s.Send(t.Context(), 1, Frame{Kind: FrameData, Payload: make([]byte, MaxFrameSize+1)})
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("Send of %d bytes: %v, want ErrFrameTooLarge", MaxFrameSize+1, err)
	}
}
