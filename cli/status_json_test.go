package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/internal/rpc/weirpb"
)

// status --output json always carries "error" and "restart_strategy", as
// docs/reference/cli.md promises, even for a healthy job with no error.
func TestStatusJSONOfAHealthyJobHasErrorAndRestartStrategy(t *testing.T) {
	var buf bytes.Buffer
	healthy := &weirpb.JobStatus{Id: "0123456789abcdef0123456789abcdef", Name: "wordcount", State: "RUNNING",
		RestartStrategy: "exponential-delay:initial-backoff=1s,max-backoff=1m0s,multiplier=1.5,reset-backoff-threshold=1h0m0s,jitter=0.1"}
	for _, st := range []*weirpb.JobStatus{healthy, {Id: "fedcba9876543210fedcba9876543210", Name: "wordcount", State: "CREATED"}} {
		buf.Reset()
		if err := printJobs(&buf, "json", []*weirpb.JobStatus{st}, true); err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
			t.Fatalf("%v: %q", err, buf.String())
		}
		for _, k := range []string{"id", "name", "state", "restarts", "last_completed_checkpoint", "error", "restart_strategy"} {
			if _, ok := doc[k]; !ok {
				t.Errorf("status --output json of a %s job lacks %q: %s", st.State, k, buf.String())
			}
		}
		if doc["restart_strategy"] != st.RestartStrategy {
			t.Errorf("restart_strategy %v, want %q", doc["restart_strategy"], st.RestartStrategy)
		}
	}
}

// A RESTARTING job waiting out its restart strategy's delay shows when
// its next attempt starts: next_attempt_at in --output json, and in the
// table's state column; a job that waits for none shows neither.
func TestStatusShowsWhenARestartingJobsNextAttemptStarts(t *testing.T) {
	at := time.Date(2026, 12, 6, 1, 30, 0, 0, time.UTC)
	tests := []struct {
		name      string
		st        *weirpb.JobStatus
		wantJSON  string // "" for absent
		wantTable string
	}{
		{"waiting out the delay", &weirpb.JobStatus{Id: "0123456789abcdef0123456789abcdef", Name: "wordcount", State: "RESTARTING",
			NextAttemptUnixMs: at.UnixMilli()}, "2026-12-06T01:30:00Z", "RESTARTING (next attempt at 2026-12-06T01:30:00Z)"},
		{"and for slots", &weirpb.JobStatus{Id: "0123456789abcdef0123456789abcdef", Name: "wordcount", State: "RESTARTING",
			NextAttemptUnixMs: at.UnixMilli(), Waiting: "waiting for 2 slots, 0 free"}, "2026-12-06T01:30:00Z",
			"RESTARTING (next attempt at 2026-12-06T01:30:00Z; waiting for 2 slots, 0 free)"},
		{"running", &weirpb.JobStatus{Id: "0123456789abcdef0123456789abcdef", Name: "wordcount", State: "RUNNING"}, "", "RUNNING  "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := printJobs(&buf, "json", []*weirpb.JobStatus{tt.st}, true); err != nil {
				t.Fatal(err)
			}
			var doc map[string]any
			if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
				t.Fatalf("%v: %q", err, buf.String())
			}
			if got, ok := doc["next_attempt_at"]; tt.wantJSON == "" && ok || tt.wantJSON != "" && got != tt.wantJSON {
				t.Errorf("next_attempt_at %v (present %v), want %q", got, ok, tt.wantJSON)
			}
			buf.Reset()
			if err := printJobs(&buf, "table", []*weirpb.JobStatus{tt.st}, true); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(buf.String(), tt.wantTable) {
				t.Errorf("table %q lacks %q", buf.String(), tt.wantTable)
			}
		})
	}
}

// status shows the job's state backend: a line under the table and
// state_backend in --output json.
func TestStatusShowsTheJobsStateBackend(t *testing.T) {
	st := &weirpb.JobStatus{Id: "0123456789abcdef0123456789abcdef", Name: "wordcount", State: "RUNNING", StateBackend: "pebble"}
	var buf bytes.Buffer
	if err := printJobs(&buf, "table", []*weirpb.JobStatus{st}, true); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "state backend: pebble\n") {
		t.Errorf("status table %q lacks the state backend", buf.String())
	}
	buf.Reset()
	if err := printJobs(&buf, "json", []*weirpb.JobStatus{st}, true); err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc["state_backend"] != "pebble" {
		t.Errorf("state_backend %v, want pebble: %s", doc["state_backend"], buf.String())
	}
}
