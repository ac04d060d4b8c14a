package jobmanager_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/weirstream/weir/internal/rpc"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/jobmanager"
)

// submittedNumbers starts a job manager with opts added, registers one
// task manager of one slot, and submits the numbers job with interval.
func submittedNumbers(t *testing.T, interval time.Duration, opts ...jobmanager.Opt) (s *jobmanager.Server, addr, id string) {
	t.Helper()
	s, err := jobmanager.New(append([]jobmanager.Opt{jobmanager.Jobs(numbersRegistry(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	addr, _ = serve(t, s)
	register(t, addr, "tm-1", 1)
	waitFor(t, s, "registered task manager", func(tms []jobmanager.TaskManager) bool { return len(tms) == 1 })
	id, err = s.Submit(t.Context(), "numbers", nil, interval, "")
	if err != nil {
		t.Fatal(err)
	}
	return s, addr, id
}

// A healthy job's status always carries "error" (empty) and
// "restart_strategy" (the strategy in force, the default when the job was
// submitted without one), over REST and over the control plane the CLI
// reads, as the references promise.
func TestAHealthyJobsStatusCarriesErrorAndTheRestartStrategyInForce(t *testing.T) {
	s, addr, id := submittedNumbers(t, time.Second)
	want := jobmanager.DefaultRestartStrategy().String()

	hs := httptest.NewServer(s.HTTPHandler())
	t.Cleanup(hs.Close)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, hs.URL+"/jobs/"+id, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hs.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /jobs/%s: %d %q %v", id, resp.StatusCode, b, err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if e, ok := doc["error"]; !ok || e != "" {
		t.Errorf("REST job details: error %v (present %v), want present and empty", e, ok)
	}
	if got := doc["restart_strategy"]; got != want {
		t.Errorf("REST job details: restart_strategy %v, want %q", got, want)
	}

	cc, err := rpc.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	st, err := weirpb.NewJobManagerClient(cc).GetJob(t.Context(), &weirpb.GetJobRequest{JobId: id})
	if err != nil {
		t.Fatal(err)
	}
	if st.RestartStrategy != want || st.Error != "" {
		t.Errorf("GetJob: restart_strategy %q, error %q; want %q and none", st.RestartStrategy, st.Error, want)
	}
}
