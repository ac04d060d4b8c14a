package cli

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
)

// progressLine shows the status of long work (demo, bench) on stderr. On a
// terminal it keeps one live line, rewritten in place; otherwise (a file, a
// pipe, CI) it prints a plain line at most every plainEvery, so logs stay
// readable. With --log-format json the plain lines are log entries
// ("progress", with the status in "status"), so stderr stays JSON. Status ""
// clears the live line before results are printed.
//
// It is also the writer logs go through (app.stderrSink), so a log line
// never lands on the end of the live line: the live line is erased, the log
// written, and the live line drawn again below it.
type progressLine struct {
	mu    sync.Mutex
	w     io.Writer
	live  bool
	plain func(status string) // prints one plain status line; called without mu
	every time.Duration
	now   func() time.Time

	status    string    // the live line on the terminal; "" when none
	lastPlain time.Time // when the last plain line was printed
	lastLive  time.Time
}

// plainEvery is how often a plain progress line is printed when stderr is
// not a terminal; liveEvery bounds how often the live line is redrawn.
const (
	plainEvery = 5 * time.Second
	liveEvery  = 100 * time.Millisecond
)

// eraseLine returns the cursor to the start of the line and clears it.
const eraseLine = "\r\033[K"

// stderrSink returns the app's stderr as logs and progress share it, made
// on first use: live (one line rewritten in place) when stderr is a
// terminal and logs are for people (console format).
func (a *app) stderrSink() *progressLine {
	if a.sink == nil {
		a.sink = &progressLine{w: a.stderr, live: a.logFormat != "json" && isTerminal(a.stderr), every: plainEvery, now: time.Now}
		a.sink.plain = func(s string) { fmt.Fprintln(a.stderr, s) }
	}
	return a.sink
}

// progress returns the progress line of a command: live on a terminal,
// otherwise plain lines on stderr, or INFO entries of log with --log-format
// json.
func (a *app) progress(log *zap.Logger) *progressLine {
	p := a.stderrSink()
	if a.logFormat == "json" {
		p.plain = func(s string) { log.Info("progress", zap.String("status", s)) }
	}
	return p
}

// isTerminal reports whether w is a character device (a terminal) that is
// not declared dumb.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0 && os.Getenv("TERM") != "dumb"
}

// Update shows status; "" clears the live line (and prints nothing when not
// live).
func (p *progressLine) Update(status string) {
	p.mu.Lock()
	now := p.now()
	switch {
	case status == "":
		if p.status != "" {
			fmt.Fprint(p.w, eraseLine)
			p.status = ""
		}
		// The next plain status after a result is shown at once.
		p.lastPlain = time.Time{}
	case p.live:
		if p.status == "" || now.Sub(p.lastLive) >= liveEvery {
			fmt.Fprint(p.w, eraseLine+status)
			p.status, p.lastLive = status, now
		}
	case p.lastPlain.IsZero() || now.Sub(p.lastPlain) >= p.every:
		p.lastPlain = now
		p.mu.Unlock()
		p.plain(status) // may log, which writes through p
		return
	}
	p.mu.Unlock()
}

// Write writes a log line, moving the live line below it.
func (p *progressLine) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.status == "" {
		return p.w.Write(b)
	}
	if _, err := io.WriteString(p.w, eraseLine); err != nil {
		return 0, err
	}
	n, err := p.w.Write(b)
	if err == nil {
		_, err = io.WriteString(p.w, p.status)
	}
	return n, err
}

// Sync flushes stderr when it can be flushed.
func (p *progressLine) Sync() error {
	if s, ok := p.w.(interface{ Sync() error }); ok {
		_ = s.Sync() // a terminal or pipe cannot be synced: not an error
	}
	return nil
}
