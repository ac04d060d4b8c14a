package cli

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/examples/wordcount"
)

// The share-group source's pendingRecords (Flink's metric: the group's
// records not yet done, per input partition) are on the task managers'
// /metrics and, summed per source task and vertex, in the job's REST
// details, with records-lag-max (the most lagging partition's); once the
// job has counted every line they are 0.
func TestPendingRecordsShowInTheMetricsAndTheJobsDetails(t *testing.T) {
	c := startLocal(t, "--taskmanagers", "2", "--slots", "2", "--metrics", "127.0.0.1:0")
	jm := "http://" + c.addr(t, "jobmanager http on")
	tmMetrics := "http://" + c.addr(t, "taskmanager metrics on") + "/metrics"
	lines := testLines(300, "p")
	produceLines(t, c.broker, "lines", lines)
	id := c.submitWordcount(t, "100ms")
	waitCounted(t, c.broker, "counts", wordcount.Expected(lines))

	var metricsOK, restOK bool
	var last string
	for deadline := time.Now().Add(60 * time.Second); !(metricsOK && restOK); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pendingRecords not 0 on every input partition within 60s of the last count (metrics %v, REST %v): %s", metricsOK, restOK, last)
		}
		inputs, done := 0, true
		for _, s := range samples(scrape(t, tmMetrics), "weir_pendingRecords") {
			if s.labels["job_id"] != id {
				continue
			}
			if strings.HasPrefix(s.labels["partition"], "lines-") {
				inputs++
			}
			done = done && s.value == 0
		}
		metricsOK = inputs > 0 && done
		var details struct {
			Vertices []struct {
				Name    string `json:"name"`
				Metrics struct {
					Pending *int64 `json:"pendingRecords"`
					LagMax  *int64 `json:"records-lag-max"`
				} `json:"metrics"`
				Subtasks []struct {
					Metrics struct {
						Pending *int64 `json:"pendingRecords"`
						LagMax  *int64 `json:"records-lag-max"`
					} `json:"metrics"`
				} `json:"subtasks"`
			} `json:"vertices"`
		}
		getJSON(t, jm+"/jobs/"+id, &details)
		sources := 0
		restOK = true
		for _, v := range details.Vertices {
			if p := v.Metrics.Pending; p != nil {
				sources++
				restOK = restOK && *p == 0 && v.Metrics.LagMax != nil && *v.Metrics.LagMax == 0
				// The subtask that measures the group reports both.
				reporting := 0
				for _, st := range v.Subtasks {
					if st.Metrics.Pending != nil && st.Metrics.LagMax != nil && *st.Metrics.LagMax == 0 {
						reporting++
					}
				}
				restOK = restOK && reporting == 1
			}
		}
		restOK = restOK && sources == 1
		last = fmt.Sprintf("%+v", details)
	}
}
