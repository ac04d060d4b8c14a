package cli

import (
	"bytes"
	"encoding/json"
	"testing"

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
