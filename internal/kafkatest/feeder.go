package kafkatest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Feeder writes test input while a test runs: a batch of lines every
// period, from its own goroutine, until Halt. It is the one input loop of
// the process tests (cmd/streamctl) and the chaos suite (test/chaos).
type Feeder struct {
	// Lines per batch (default 20) and Every, the pause before each batch
	// (default 20 ms).
	Lines int
	Every time.Duration

	stop  chan struct{}
	ended chan error
}

// Run calls write(ctx, Lines) every Every from a new goroutine until Halt
// or until write fails.
func (f *Feeder) Run(ctx context.Context, write func(ctx context.Context, lines int) error) {
	lines, every := f.Lines, f.Every
	if lines <= 0 {
		lines = 20
	}
	if every <= 0 {
		every = 20 * time.Millisecond
	}
	f.stop, f.ended = make(chan struct{}), make(chan error, 1)
	go func() {
		for {
			select {
			case <-f.stop:
				f.ended <- nil
				return
			case <-time.After(every):
			}
			if err := write(ctx, lines); err != nil {
				f.ended <- err
				return
			}
		}
	}()
}

// Halt stops the goroutine and fails the test if a write failed.
func (f *Feeder) Halt(t testing.TB) {
	t.Helper()
	close(f.stop)
	if err := <-f.ended; err != nil {
		t.Fatalf("write input: %v", err)
	}
}

var inputWords = strings.Fields("the quick brown fox jumps over the lazy dog")

// InputLine is line i of the tests' input: two common words and the line's
// own word l<i>, so the committed output tells which lines were processed.
func InputLine(i int) string {
	return fmt.Sprintf("%s %s l%d", inputWords[i%len(inputWords)], inputWords[(i*7)%len(inputWords)], i)
}
