package cli

import (
	"bytes"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestProgressLine(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	type step struct {
		at     time.Duration // since t0
		status string
	}
	steps := []step{{0, "a"}, {50 * time.Millisecond, "b"}, {time.Second, "c"}, {6 * time.Second, "d"}, {6100 * time.Millisecond, ""}, {6200 * time.Millisecond, "e"}}
	tests := []struct {
		name   string
		format string
		live   bool
		want   string
	}{
		// Not a terminal: the first status, then one every 5 s; after
		// a clear (a result was printed) the next one at once.
		{"plain", "console", false, "a\nd\ne\n"},
		// A terminal: one line rewritten in place, at most every 100 ms,
		// erased by "".
		{"live", "console", true, "\r\033[Ka\r\033[Kc\r\033[Kd\r\033[K\r\033[Ke"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var errb bytes.Buffer
			a := &app{stdout: io.Discard, stderr: &errb, logLevel: "info", logFormat: tt.format}
			log, err := a.logger()
			if err != nil {
				t.Fatal(err)
			}
			p := a.progress(log)
			p.live = tt.live // the test's stderr is a buffer, never a terminal
			var now time.Time
			p.now = func() time.Time { return now }
			for _, s := range steps {
				now = t0.Add(s.at)
				p.Update(s.status)
			}
			if got := errb.String(); got != tt.want {
				t.Fatalf("progress wrote %q, want %q", got, tt.want)
			}
		})
	}
}

// With --log-format json, progress lines are log entries, so stderr stays
// JSON.
func TestProgressIsLoggedWithJSONLogs(t *testing.T) {
	var errb bytes.Buffer
	a := &app{stdout: io.Discard, stderr: &errb, logLevel: "info", logFormat: "json"}
	log, err := a.logger()
	if err != nil {
		t.Fatal(err)
	}
	a.progress(log).Update("wordcount: 3s")
	lines := parseLogLines(t, errb.String())
	if len(lines) != 1 || lines[0].obj["msg"] != "progress" || lines[0].obj["status"] != "wordcount: 3s" {
		t.Fatalf("stderr = %q, want one JSON progress entry", errb.String())
	}
}

// A demo whose stderr is not a terminal prints plain progress lines, never
// terminal control characters.
func TestDemoPrintsPlainProgressWhenNotATerminal(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo")
	}
	stdout, stderr, err := runCLI(t, "demo", "--lines", "300", "--log-level", "warn")
	if err != nil {
		t.Fatalf("demo: %v\n%s\n%s", err, stdout, stderr)
	}
	if !strings.Contains(stderr, "output records committed\n") || strings.Contains(stderr, "\r") || strings.Contains(stdout, "output records committed") {
		t.Fatalf("stderr %q: want plain progress lines (and none on stdout %q)", stderr, stdout)
	}
}

// A log line written while the live line is shown erases it, and the live
// line is drawn again below the log line.
func TestLogLinesDoNotLandOnTheLiveLine(t *testing.T) {
	var errb bytes.Buffer
	a := &app{stdout: io.Discard, stderr: &errb, logLevel: "info", logFormat: "console"}
	log, err := a.logger()
	if err != nil {
		t.Fatal(err)
	}
	p := a.progress(log)
	p.live = true
	p.Update("wordcount: 1s")
	log.Warn("job failed, restarting")
	p.Update("")
	log.Info("after")
	got := errb.String()
	want := regexp.MustCompile(`^\r\033\[Kwordcount: 1s\r\033\[K[^\r\n]*WARN\tjob failed, restarting\nwordcount: 1s\r\033\[K[^\r\n]*INFO\tafter\n$`)
	if !want.MatchString(got) {
		t.Fatalf("stderr = %q, want the live line erased before the log line and drawn again after it", got)
	}
}
