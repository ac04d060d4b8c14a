package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// iso8601 is the layout of zapcore.ISO8601TimeEncoder.
const iso8601 = "2006-01-02T15:04:05.000Z0700"

// logLine is one JSON log line, decoded with its keys in order.
type logLine struct {
	raw  string
	keys []string // top-level keys, in order, repeats included
	obj  map[string]any
}

// parseLogLines decodes stderr as JSON lines and fails the test on anything
// else: a non-JSON line, a repeated key at any depth, or a timestamp that is
// not ISO 8601.
func parseLogLines(t *testing.T, stderr string) []logLine {
	t.Helper()
	var out []logLine
	for _, raw := range strings.Split(strings.TrimSpace(stderr), "\n") {
		if raw == "" {
			continue
		}
		keys, err := objectKeys(json.NewDecoder(strings.NewReader(raw)))
		if err != nil {
			t.Fatalf("log line is not a JSON object without repeated keys: %v\n%s", err, raw)
		}
		l := logLine{raw: raw, keys: keys}
		if err := json.Unmarshal([]byte(raw), &l.obj); err != nil {
			t.Fatalf("%v: %s", err, raw)
		}
		ts, _ := l.obj["ts"].(string)
		if _, err := time.Parse(iso8601, ts); err != nil {
			t.Fatalf("ts %v is not ISO 8601 (%s): %s", l.obj["ts"], iso8601, raw)
		}
		out = append(out, l)
	}
	return out
}

// objectKeys reads one JSON object from d and returns its keys, failing on a
// key repeated in it or in any nested object.
func objectKeys(d *json.Decoder) ([]string, error) {
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("want an object, got %v (%v)", tok, err)
	}
	var keys []string
	seen := map[string]bool{}
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return nil, err
		}
		k := tok.(string)
		if seen[k] {
			return nil, fmt.Errorf("key %q repeated", k)
		}
		seen[k] = true
		keys = append(keys, k)
		if err := skipValue(d); err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
	}
	_, err := d.Token() // '}'
	return keys, err
}

// skipValue reads one JSON value, checking nested objects for repeated keys.
func skipValue(d *json.Decoder) error {
	if !d.More() {
		return io.ErrUnexpectedEOF
	}
	var raw json.RawMessage
	if err := d.Decode(&raw); err != nil {
		return err
	}
	switch {
	case len(raw) > 0 && raw[0] == '{':
		_, err := objectKeys(json.NewDecoder(bytes.NewReader(raw)))
		return err
	case len(raw) > 0 && raw[0] == '[':
		inner := json.NewDecoder(bytes.NewReader(raw))
		if _, err := inner.Token(); err != nil {
			return err
		}
		for inner.More() {
			if err := skipValue(inner); err != nil {
				return err
			}
		}
	}
	return nil
}

func TestJSONLogsHaveISO8601TimesAndEachKeyOnce(t *testing.T) {
	var errb bytes.Buffer
	a := &app{stdout: io.Discard, stderr: &errb, logLevel: "debug", logFormat: "json"}
	log, err := a.logger()
	if err != nil {
		t.Fatal(err)
	}
	// A logger scoped to a subtask, handed to a library that adds the
	// subtask itself (what runtime and internal/kafkatxn do).
	sub := log.With(zap.String("operator", "lines"), zap.Int("subtask", 1))
	sub.Debug("transactional writer created", zap.Int("subtask", 1), zap.Int("pool", 5))
	sub.With(zap.Int("subtask", 1)).Info("again", zap.String("k", "v"), zap.String("k", "w"))
	// A namespace nests later keys: they are kept.
	log.Info("nested", zap.String("a", "1"), zap.Namespace("inner"), zap.String("a", "2"))
	_ = log.Sync()

	lines := parseLogLines(t, errb.String())
	if len(lines) != 3 {
		t.Fatalf("want 3 log lines, got %d:\n%s", len(lines), errb.String())
	}
	tests := []struct {
		keys string
		want map[string]any
	}{
		{"level,ts,msg,operator,subtask,pool", map[string]any{"subtask": 1.0, "pool": 5.0}},
		{"level,ts,msg,operator,subtask,k", map[string]any{"k": "v"}}, // the first value wins
		{"level,ts,msg,a,inner", map[string]any{"a": "1", "inner": map[string]any{"a": "2"}}},
	}
	for i, tt := range tests {
		if got := strings.Join(lines[i].keys, ","); got != tt.keys {
			t.Errorf("line %d keys = %s, want %s\n%s", i, got, tt.keys, lines[i].raw)
		}
		for k, v := range tt.want {
			if fmt.Sprint(lines[i].obj[k]) != fmt.Sprint(v) {
				t.Errorf("line %d: %s = %v, want %v", i, k, lines[i].obj[k], v)
			}
		}
	}
}

func TestPebbleChatterStaysBelowInfo(t *testing.T) {
	for _, level := range []string{"info", "debug"} {
		t.Run(level, func(t *testing.T) {
			var errb bytes.Buffer
			a := &app{stdout: io.Discard, stderr: &errb, logLevel: level, logFormat: "json"}
			log, err := a.logger()
			if err != nil {
				t.Fatal(err)
			}
			// The two ways a component reaches a log entry: in the
			// entry (as checkpoint's pebble adapter does) or by With.
			log.Info("Found 0 WALs", zap.String("component", "pebble"))
			log.With(zap.String("component", "pebble")).Info("WAL created")
			log.Warn("disk stall", zap.String("component", "pebble"))
			log.Info("checkpoint completed", zap.String("component", "checkpoint"))
			_ = log.Sync()
			var got []string
			for _, l := range parseLogLines(t, errb.String()) {
				got = append(got, fmt.Sprintf("%s %s", l.obj["level"], l.obj["msg"]))
			}
			want := "warn disk stall|info checkpoint completed"
			if level == "debug" {
				want = "debug Found 0 WALs|debug WAL created|" + want
			}
			if strings.Join(got, "|") != want {
				t.Fatalf("at --log-level %s logged %q, want %q", level, strings.Join(got, "|"), want)
			}
		})
	}
}

// The real demo, logging JSON: every line is one JSON object with each key
// once and an ISO 8601 time; at INFO neither pebble nor the embedded broker's
// kfake says anything.
func TestDemoLogsAreCleanJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo")
	}
	for _, level := range []string{"debug", "info"} {
		t.Run(level, func(t *testing.T) {
			stdout, stderr, err := runCLI(t, "demo", "--lines", "300", "--log-format", "json", "--log-level", level)
			if err != nil {
				t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
			}
			lines := parseLogLines(t, stderr)
			if len(lines) == 0 {
				t.Fatal("demo logged nothing")
			}
			for _, l := range lines {
				if level == "info" && (l.obj["component"] == "pebble" || l.obj["logger"] == "kfake") {
					t.Errorf("chatter at INFO: %s", l.raw)
				}
			}
		})
	}
}
