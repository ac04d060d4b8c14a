package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/failpoint"
)

// waitStatus polls job id's status until ok accepts it (60s at most).
func (c *localCluster) waitStatus(t *testing.T, id, what string, ok func(jobJSON) bool) jobJSON {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st := c.status(t, id)
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: %s did not happen within 60s: %+v", id, what, st)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// words is how many counts wordcount writes for lines: one per word.
func words(want map[string]int) int64 {
	n := 0
	for _, c := range want {
		n += c
	}
	return int64(n)
}

// What an operator reads about a job's failures and its end, on a local
// cluster whose sink fails once (a failpoint): the job restarts and still
// counts every word exactly once; status shows the last failure (when, in
// which subtask on which task manager, what) in JSON and as a line of the
// table; list has a LAST FAILURE column and lists the newest job first
// under the name given at submit; GET /jobs/{id}/exceptions has the
// failure in Flink's shape; and a cancelled job keeps the record counts of
// its last attempt in status, list and REST.
func TestStatusListAndRESTShowTheLastFailureTheNameAndTheFinalCounts(t *testing.T) {
	t.Setenv(failpoint.EnvVar, failpoint.SinkAfterPrecommit+"=error@2")
	c := startLocal(t, "--taskmanagers", "2", "--slots", "2")
	httpAddr := c.addr(t, "jobmanager http on")

	lines := testLines(400, "f")
	produceLines(t, c.broker, "lines", lines)
	first := c.submitWordcount(t, "200ms")
	waitCounted(t, c.broker, "counts", wordcount.Expected(lines))
	st := c.waitStatus(t, first, "a restart", func(j jobJSON) bool { return j.Restarts > 0 && j.State == "RUNNING" })
	f := st.LastFailure
	if f == nil || !strings.Contains(f.Message, failpoint.ErrInjected.Error()) || !f.Restarted ||
		!strings.HasPrefix(f.TaskManager, "local-tm-") || !strings.Contains(f.Task, "/2)") || f.Time == "" {
		t.Fatalf("status --output json: last_failure %+v; want the injected failure of a subtask \"NAME (i/2)\" on a local task manager, restarted", f)
	}
	out, err := c.cli(t, "status", first)
	if err != nil {
		t.Fatal(err)
	}
	if want := "last failure at " + f.Time + " in " + f.Task + " on " + f.TaskManager + " (the job restarted): "; !strings.Contains(out, want) {
		t.Errorf("status prints %q; want a line with %q", out, want)
	}
	var exc struct {
		ExceptionHistory struct {
			Entries []struct {
				ExceptionName string  `json:"exceptionName"`
				TaskName      *string `json:"taskName"`
				TaskManagerID *string `json:"taskManagerId"`
			} `json:"entries"`
		} `json:"exceptionHistory"`
	}
	getJSON(t, "http://"+httpAddr+"/jobs/"+first+"/exceptions", &exc)
	if e := exc.ExceptionHistory.Entries; len(e) != 1 || e[0].TaskName == nil || *e[0].TaskName != f.Task ||
		e[0].TaskManagerID == nil || *e[0].TaskManagerID != f.TaskManager || e[0].ExceptionName != f.Message {
		t.Errorf("GET /jobs/%s/exceptions: entries %+v; want the one failure of %s on %s", first, e, f.Task, f.TaskManager)
	}

	// A second job, named, submitted later (the failpoint fired already).
	lines2 := testLines(300, "s")
	produceLines(t, c.broker, "lines2", lines2)
	out, err = c.cli(t, "submit", "wordcount", "--name", "second count", "--parallelism", "2", "--checkpoint-interval", "200ms",
		"--set", "brokers="+c.broker, "--set", "input=lines2", "--set", "output=counts2")
	if err != nil {
		t.Fatal(err)
	}
	second := strings.TrimSpace(out)
	want2 := wordcount.Expected(lines2)
	waitCounted(t, c.broker, "counts2", want2)
	c.waitStatus(t, second, "every record counted", func(j jobJSON) bool {
		return j.RecordsIn == int64(len(lines2)) && j.RecordsOut == words(want2)
	})
	if _, err = c.cli(t, "cancel", second); err != nil {
		t.Fatal(err)
	}
	st2 := c.status(t, second)
	if st2.State != "CANCELED" || st2.Name != "second count" || st2.JobType != "wordcount" || st2.LastFailure != nil ||
		st2.RecordsIn != int64(len(lines2)) || st2.RecordsOut != words(want2) {
		t.Errorf("status of the cancelled job: %+v; want CANCELED, named %q, no failure, %d records in and %d out",
			st2, "second count", len(lines2), words(want2))
	}
	var details struct {
		Name       string `json:"name"`
		RecordsIn  int64  `json:"records_in"`
		RecordsOut int64  `json:"records_out"`
	}
	getJSON(t, "http://"+httpAddr+"/jobs/"+second, &details)
	if details.Name != "second count" || details.RecordsIn != int64(len(lines2)) || details.RecordsOut != words(want2) {
		t.Errorf("GET /jobs/%s: %+v; want the name and the final counts", second, details)
	}

	out, err = c.cli(t, "list", "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	var list []jobJSON
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("list --output json: %v: %q", err, out)
	}
	if len(list) != 2 || list[0].ID != second || list[1].ID != first || list[0].RecordsIn != int64(len(lines2)) ||
		list[1].LastFailure == nil {
		t.Errorf("list --output json: %+v; want %s (cancelled, with its counts) then %s (with its last failure)", list, second, first)
	}
	out, err = c.cli(t, "list")
	if err != nil {
		t.Fatal(err)
	}
	rows := strings.Split(strings.TrimSpace(out), "\n")
	if len(rows) != 3 || !strings.Contains(rows[0], "LAST FAILURE") || !strings.HasPrefix(rows[1], second+"  second count  CANCELED") ||
		!strings.Contains(rows[2], f.Time) {
		t.Errorf("list prints\n%s\nwant a LAST FAILURE column, the second job first, the first's failure time", out)
	}
}
