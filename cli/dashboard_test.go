package cli

import (
	"context"
	"fmt"
	"html"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// chromium finds a headless-capable Chromium: $WEIR_CHROMIUM, else chromium
// on PATH. CI (.ci/run) installs Debian's; elsewhere the browser test is
// skipped when there is none, and fails in CI.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("WEIR_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no chromium on PATH: .ci/run installs Debian's chromium for the dashboard test")
	}
	t.Skip("no chromium on PATH (apt-get install chromium, or set WEIR_CHROMIUM)")
	return ""
}

// render loads url in headless Chromium, lets the page run for budget of
// virtual time (its refreshes included) and returns the DOM as rendered.
// With screenshot set it also saves a PNG of the page there.
func render(t *testing.T, url string, budget time.Duration, screenshot string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	args := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir(), fmt.Sprintf("--virtual-time-budget=%d", budget.Milliseconds())}
	if screenshot != "" {
		shot := exec.CommandContext(ctx, chromium(t), append(args, "--window-size=1280,1450", "--screenshot="+screenshot, url)...)
		if out, err := shot.CombinedOutput(); err != nil {
			t.Fatalf("chromium --screenshot: %v\n%s", err, out)
		}
		t.Logf("dashboard screenshot saved to %s", screenshot)
	}
	cmd := exec.CommandContext(ctx, chromium(t), append(args, "--dump-dom", url)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom %s: %v\n%s", url, err, stderr.String())
	}
	return string(out)
}

// The dashboard, loaded in a real browser while wordcount runs on two task
// managers, shows what the REST API says: the job RUNNING, every vertex of
// its graph with its parallelism and live rates (computed from two
// refreshes), completed checkpoints in the table and the chart, and both
// task managers. Set WEIR_DASHBOARD_SCREENSHOT=docs/dashboard.png to
// refresh the README's screenshot.
func TestDashboardRendersTheRunningJobInABrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster and a browser")
	}
	chromium(t) // skip (or fail in CI) before starting the cluster
	c := startLocal(t, "--taskmanagers", "2", "--slots", "2")
	jm := "http://" + c.addr(t, "jobmanager http on")
	produceLines(t, c.broker, "lines", testLines(300, "d"))
	id := c.submitWordcount(t, "200ms")
	// Wait for completed checkpoints, so the history has rows.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if st := c.status(t, id); st.State == "RUNNING" && st.LastCompletedCheckpoint >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s did not complete 3 checkpoints in 60s: %+v", id, c.status(t, id))
		}
	}
	var job struct {
		Vertices []struct {
			Name        string `json:"name"`
			Parallelism int    `json:"parallelism"`
			Subtasks    []struct {
				TaskID      string `json:"task_id"`
				TaskManager string `json:"taskmanager-id"`
			} `json:"subtasks"`
		} `json:"vertices"`
	}
	getJSON(t, jm+"/jobs/"+id, &job)
	var list struct {
		TaskManagers []struct {
			ID string `json:"id"`
		} `json:"taskmanagers"`
	}
	getJSON(t, jm+"/taskmanagers", &list)
	tms := list.TaskManagers
	if len(job.Vertices) == 0 || len(tms) != 2 {
		t.Fatalf("REST shows %d vertices and %d task managers", len(job.Vertices), len(tms))
	}

	dom := render(t, jm+"/", 7*time.Second, os.Getenv("WEIR_DASHBOARD_SCREENSHOT"))
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf(format+"\nrendered DOM:\n%s", append(args, dom)...)
	}
	if !regexp.MustCompile(`<tr class="job selected" data-job="` + id + `">.*?RUNNING`).MatchString(dom) {
		fail("the jobs table does not show job %s RUNNING and selected", id)
	}
	if !strings.Contains(dom, `id="job-id">`+id+`<`) {
		fail("the job section does not show job %s", id)
	}
	for _, v := range job.Vertices {
		name := html.EscapeString(v.Name) // as the DOM serialises it ("lines -&gt; split")
		box := regexp.MustCompile(`data-vertex="` + regexp.QuoteMeta(name) + `".*?</g>`).FindString(dom)
		if box == "" {
			fail("the graph has no vertex %q", v.Name)
			continue
		}
		if want := fmt.Sprintf("%s ×%d", name, v.Parallelism); !strings.Contains(box, want) {
			fail("vertex %q does not show %q: %s", v.Name, want, box)
		}
		// Rates need two refreshes: "in 1.2k/s" and "back-pressured 3%", not "–".
		if !regexp.MustCompile(`RUNNING · in [0-9.]+[kM]?/s · out [0-9.]+[kM]?/s`).MatchString(box) ||
			!regexp.MustCompile(`back-pressured \d+%`).MatchString(box) {
			fail("vertex %q shows no live rates: %s", v.Name, box)
		}
		if len(v.Subtasks) != v.Parallelism {
			t.Errorf("REST shows %d subtasks of %q, want %d", len(v.Subtasks), v.Name, v.Parallelism)
		}
		for _, s := range v.Subtasks {
			row := regexp.MustCompile(`<tr data-task="` + regexp.QuoteMeta(html.EscapeString(s.TaskID)) + `">.*?</tr>`).FindString(dom)
			if !strings.Contains(row, "<td>"+s.TaskManager+"</td>") || !strings.Contains(row, "RUNNING") ||
				!regexp.MustCompile(`<td>[0-9.]+[kM]?/s</td><td>[0-9.]+[kM]?/s</td><td>\d+%</td>`).MatchString(row) {
				fail("the tasks table does not show task %s RUNNING on %s with its rates: %q", s.TaskID, s.TaskManager, row)
			}
		}
	}
	if n := len(regexp.MustCompile(`<tr data-checkpoint="\d+"><td>\d+</td><td><span class="state COMPLETED">`).FindAllString(dom, -1)); n < 2 {
		fail("the checkpoint table shows %d completed checkpoints, want at least 2", n)
	}
	if !strings.Contains(dom, `class="bar COMPLETED"`) {
		fail("the checkpoint chart has no bar for a completed checkpoint")
	}
	for _, tm := range tms {
		if !strings.Contains(dom, `data-taskmanager="`+tm.ID+`"`) {
			fail("the task managers table does not show %s", tm.ID)
		}
	}
	if !regexp.MustCompile(`id="problem" class="problem" hidden`).MatchString(dom) {
		fail("the page shows a problem")
	}
}
