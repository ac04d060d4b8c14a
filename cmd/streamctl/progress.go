package main

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
type progressLine struct {
	mu    sync.Mutex
	w     io.Writer
	live  bool
	plain func(status string) // prints one plain status line
	every time.Duration
	now   func() time.Time

	shown     bool      // a live line is on the terminal
	lastPlain time.Time // when the last plain line was printed
	lastLive  time.Time
}

// plainEvery is how often a plain progress line is printed when stderr is
// not a terminal; liveEvery bounds how often the live line is redrawn.
const (
	plainEvery = 5 * time.Second
	liveEvery  = 100 * time.Millisecond
)

// progress returns the progress line of a command: live when stderr is a
// terminal and logs are for people (console format), otherwise plain lines
// on stderr, or INFO entries of log with --log-format json.
func (a *app) progress(log *zap.Logger) *progressLine {
	p := &progressLine{w: a.stderr, every: plainEvery, now: time.Now}
	switch {
	case a.logFormat == "json":
		p.plain = func(s string) { log.Info("progress", zap.String("status", s)) }
	default:
		p.live = isTerminal(a.stderr)
		p.plain = func(s string) { fmt.Fprintln(a.stderr, s) }
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
	defer p.mu.Unlock()
	now := p.now()
	switch {
	case status == "":
		if p.shown {
			fmt.Fprint(p.w, "\r\033[K")
			p.shown = false
		}
		// The next plain status after a result is shown at once.
		p.lastPlain = time.Time{}
	case p.live:
		if p.shown && now.Sub(p.lastLive) < liveEvery {
			return
		}
		fmt.Fprint(p.w, "\r\033[K"+status)
		p.shown, p.lastLive = true, now
	default:
		if !p.lastPlain.IsZero() && now.Sub(p.lastPlain) < p.every {
			return
		}
		p.plain(status)
		p.lastPlain = now
	}
}
