package cli

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/internal/failpoint"
	"github.com/weirstream/weir/jobmanager"
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
func render(t *testing.T, url string, budget time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	args := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir(), fmt.Sprintf("--virtual-time-budget=%d", budget.Milliseconds())}
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
// task managers.
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
			Metrics     struct {
				Pending *int64 `json:"pendingRecords"`
				LagMax  *int64 `json:"records-lag-max"`
			} `json:"metrics"`
			Subtasks []struct {
				TaskID      string `json:"task_id"`
				TaskManager string `json:"taskmanager-id"`
			} `json:"subtasks"`
		} `json:"vertices"`
	}
	// And for the source's backlog (the share-group source measures it
	// every 5 s): its vertex shows its lag.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		getJSON(t, jm+"/jobs/"+id, &job)
		if len(job.Vertices) > 0 && job.Vertices[0].Metrics.Pending != nil && job.Vertices[0].Metrics.LagMax != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the source vertex reported no pendingRecords and records-lag-max in 60s: %+v", job)
		}
	}
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

	dom := render(t, jm+"/", 7*time.Second)
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
		// The vertex's watermark and its lag behind the clock, or "–" while
		// a subtask has none (the wordcount's source sets no watermarks).
		if !regexp.MustCompile(`watermark (–|\d\d:\d\d:\d\d\.\d{3} · lags [0-9.]+ (ms|s|min))`).MatchString(box) {
			fail("vertex %q shows no watermark line: %s", v.Name, box)
		}
		// A source that reports its backlog shows its lag: the vertex's
		// pendingRecords and its most lagging partition's.
		lagLine := regexp.MustCompile(`lag \d+ records · \d+ in the most lagging partition`)
		if has := lagLine.MatchString(box); has != (v.Metrics.Pending != nil) {
			fail("vertex %q (pendingRecords in REST: %v) shows a lag line: %v: %s", v.Name, v.Metrics.Pending != nil, has, box)
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
	// The latest completed checkpoint, per subtask: end to end, sync,
	// async and alignment durations, full and added size.
	for _, v := range job.Vertices {
		for _, st := range v.Subtasks {
			row := regexp.MustCompile(`<tr data-cp-task="` + regexp.QuoteMeta(html.EscapeString(st.TaskID)) + `">.*?</tr>`).FindString(dom)
			if !regexp.MustCompile(`^<tr[^>]*><td>[^<]+</td>(<td>[0-9.]+ (ms|s)</td>){4}(<td>[0-9.]+ (B|KiB|MiB)</td>){2}</tr>$`).MatchString(row) {
				fail("the checkpoint subtasks table does not show task %s's durations and sizes: %q", st.TaskID, row)
			}
		}
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

// The dashboard of a job manager that requires a token, in a real browser
// in real time: the token is asked for once (however many requests got
// 401); a wrong one is reported as such and never asked again by itself,
// only when the user clicks "enter token"; with the right one the page
// loads; and when the job manager goes away the page says it is
// unreachable instead of "no jobs yet".
func TestDashboardAsksForTheTokenOnceAndSaysWhyItFailed(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a browser")
	}
	b := startBrowser(t) // skips without Chromium
	srv, err := jobmanager.New(jobmanager.AuthToken("s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	hs := httptest.NewServer(srv.HTTPHandler())
	t.Cleanup(hs.Close)
	answers := []string{"wrong", "s3cret"}
	var asked int
	b.answerDialog = func(kind, _ string) (string, bool) {
		if kind != "prompt" {
			t.Errorf("the page opened a %s dialog", kind)
			return "", false
		}
		a := answers[min(asked, len(answers)-1)]
		asked++
		return a, true
	}
	b.navigate(hs.URL + "/")
	b.waitFor("the wrong token reported", `document.getElementById("problem").innerText.includes("wrong token")`, 30*time.Second)
	// Let the page refresh (every 2 s) three more times: it must not ask again.
	refreshes := len(b.sent(http.MethodGet))
	for deadline := time.Now().Add(30 * time.Second); len(b.sent(http.MethodGet)) < refreshes+6; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the page stopped refreshing")
		}
	}
	if n := b.dialogCount(); n != 1 {
		t.Fatalf("the page asked for the token %d times, want once: %v", n, b.dialogs)
	}
	if got := b.text("#jobs tbody"); strings.Contains(got, "no jobs yet") || !strings.Contains(got, "token") {
		t.Errorf("jobs table without the token reads %q, want why it is empty", got)
	}
	b.eval(`document.getElementById("enter-token").click()`, nil)
	b.waitFor("the page loaded with the right token", `document.getElementById("problem").hidden &&
		document.querySelector("#jobs tbody").innerText.includes("no jobs yet")`, 30*time.Second)
	if n := b.dialogCount(); n != 2 {
		t.Errorf("the page asked %d times, want twice (once, then on the click)", n)
	}

	hs.CloseClientConnections()
	hs.Close()
	b.waitFor("the job manager reported unreachable", `document.getElementById("problem").innerText.includes("unreachable") &&
		document.getElementById("updated").innerText === "unreachable" &&
		document.querySelector("#jobs tbody").innerText.includes("unreachable")`, 30*time.Second)
}

// The dashboard in a real browser in real time (not virtual time) while
// wordcount runs on its input: the graph's boxes show non-zero rates and
// hold their text, the checkpoint chart has bars; the cancel button
// cancels the job with a non-simple request (PATCH with a JSON body), and
// the cancelled job keeps its final record counts. Set
// WEIR_DASHBOARD_SCREENSHOT=$PWD/docs/dashboard.png to refresh the docs'
// screenshot (taken before the cancel).
func TestDashboardShowsLiveRatesAndCancelsAJobInRealTime(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster and a browser")
	}
	b := startBrowser(t) // skips without Chromium
	c := startLocal(t, "--taskmanagers", "2", "--slots", "2")
	jm := "http://" + c.addr(t, "jobmanager http on")
	ctx, stopFeeding := context.WithCancel(t.Context())
	fed := make(chan struct{})
	go func() { // input keeps coming while the page watches
		defer close(fed)
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.broker), kgo.DefaultProduceTopic("lines"), kgo.AllowAutoTopicCreation())
		if err != nil {
			t.Error(err)
			return
		}
		defer cl.Close()
		for i := 0; ctx.Err() == nil; i++ {
			var recs []*kgo.Record
			for _, l := range testLines(50, fmt.Sprintf("r%d-", i)) {
				recs = append(recs, kgo.StringRecord(l))
			}
			if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil && ctx.Err() == nil {
				t.Error(err)
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() {
		stopFeeding()
		<-fed
	})
	waitTaskManagers(t, jm, 2)
	id := c.submitWordcount(t, "200ms")
	b.navigate(jm + "/")
	b.waitFor("the job RUNNING with non-zero rates in every box", fmt.Sprintf(`(() => {
		const row = document.querySelector('tr[data-job=%q]');
		const boxes = [...document.querySelectorAll("#graph g.vertex")];
		return !!row && row.innerText.includes("RUNNING") && boxes.length >= 2 &&
			boxes.every(g => /RUNNING · in (?!0\/s)[0-9.]+[kM]?\/s/.test(g.textContent));
	})()`, id), 45*time.Second)
	var overflow []string
	b.eval(`[...document.querySelectorAll("#graph g.vertex")].flatMap(g => {
		const w = g.querySelector("rect").getBBox().width;
		return [...g.querySelectorAll("text")].filter(t => t.getBBox().x + t.getComputedTextLength() > w - 4).map(t => t.textContent + " (box " + w + ")");
	})`, &overflow)
	if len(overflow) > 0 {
		t.Errorf("text overflows the graph's boxes: %q", overflow)
	}
	b.waitFor("bars in the checkpoint chart", `document.querySelectorAll("#cp-chart rect.bar.COMPLETED").length > 0`, 30*time.Second)
	if path := os.Getenv("WEIR_DASHBOARD_SCREENSHOT"); path != "" {
		b.screenshot(path)
	}

	b.answerDialog = func(kind, msg string) (string, bool) { return "", kind == "confirm" && strings.Contains(msg, id) }
	b.eval(`document.getElementById("cancel").click()`, nil)
	b.waitFor("the job CANCELED", `document.getElementById("job-state").innerText === "CANCELED" &&
		document.getElementById("cancel").hidden`, 60*time.Second)
	patches := b.sent(http.MethodPatch)
	if len(patches) != 1 || !strings.HasSuffix(patches[0].URL, "/jobs/"+id+"?mode=cancel") ||
		patches[0].Headers["Content-Type"] != "application/json" || patches[0].Body != "{}" {
		t.Errorf("cancel sent %+v, want one PATCH /jobs/%s?mode=cancel with Content-Type application/json and a JSON body", patches, id)
	}
	if n := b.dialogCount(); n != 1 {
		t.Errorf("the page opened %d dialogs, want one (the cancel's confirmation)", n)
	}
	// The cancelled job keeps its final counts (not 0).
	b.waitFor("the cancelled job's record counts", `(() => {
		const boxes = [...document.querySelectorAll("#graph g.vertex")];
		return boxes.length >= 2 && boxes.every(g => { const m = g.textContent.match(/(\d+) in, (\d+) out/); return m && +m[1] > 0 && +m[2] > 0; });
	})()`, 10*time.Second)
}

// What the dashboard shows of a failing job, in a real browser: the last
// failure's banner names its task and task manager once and its message
// once (in the body); the exception history is there, collapsed, one entry
// per failure; while the restart strategy's delay runs, when the next
// attempt starts; and once the job ended, how long it ran and when it
// ended, not "running for".
func TestDashboardShowsTheFailureHistoryTheNextAttemptAndAnEndedJob(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster and a browser")
	}
	chromium(t)
	t.Setenv(failpoint.EnvVar, failpoint.SinkAfterPrecommit+"=error")
	c := startLocal(t, "--taskmanagers", "1", "--slots", "2")
	jm := "http://" + c.addr(t, "jobmanager http on")
	produceLines(t, c.broker, "lines", testLines(50, "h"))
	// Delays of 50 ms, 2 s, then 80 s: three failures, then a long wait.
	out, err := c.cli(t, "submit", "wordcount", "--parallelism", "2", "--checkpoint-interval", "100ms",
		"--restart-strategy", "exponential-delay:initial-backoff=50ms,multiplier=40,max-backoff=5m,jitter=0",
		"--set", "brokers="+c.broker)
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	st := c.waitStatus(t, id, "three failures and a long wait", func(j jobJSON) bool {
		return j.Restarts >= 3 && j.State == "RESTARTING" && j.NextAttemptAt != ""
	})
	dom := render(t, jm+"/", 3*time.Second)
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf(format+"\nrendered DOM:\n%s", append(args, dom)...)
	}
	head := regexp.MustCompile(`id="job-failure-head">([^<]*)<`).FindStringSubmatch(dom)
	if head == nil || strings.Count(head[1], st.LastFailure.TaskManager) != 1 || !strings.Contains(head[1], " in "+html.EscapeString(st.LastFailure.Task)) ||
		strings.Contains(head[1], failpoint.ErrInjected.Error()) {
		fail("the failure banner's head %q, want the task and %s named once, and not the message (the body has it)", head, st.LastFailure.TaskManager)
	}
	if body := regexp.MustCompile(`id="job-failure-text">([^<]*)<`).FindStringSubmatch(dom); body == nil ||
		strings.Count(body[1], failpoint.ErrInjected.Error()) != 1 {
		fail("the failure banner's body %q, want the message once", body)
	}
	history := regexp.MustCompile(`(?s)<details id="job-exceptions"[^>]*>.*?</details></li></ol></details>`).FindString(dom)
	if strings.Contains(history, " open") || strings.Contains(history, "hidden") ||
		strings.Count(history, "<li data-exception=") < 3 {
		fail("the exception history %q, want it collapsed with an entry per failure", history)
	}
	if !regexp.MustCompile(`<dt>next attempt</dt><dd>[^<]+ \(in [0-9.]+ (s|min)`).MatchString(dom) {
		fail("the job's facts do not say when the next attempt starts")
	}
	if _, err := c.cli(t, "cancel", id); err != nil {
		t.Fatal(err)
	}
	dom = render(t, jm+"/", 3*time.Second)
	row := regexp.MustCompile(`<tr class="job selected" data-job="` + id + `">.*?</tr>`).FindString(dom)
	if !regexp.MustCompile(`<td class="duration">ran [^<]+, ended [^<]+</td>`).MatchString(row) || strings.Contains(dom, "running for") {
		fail("the ended job's row %q, want how long it ran and when it ended, and no \"running for\" anywhere", row)
	}
	if !strings.Contains(dom, "<dt>ended at</dt>") || !strings.Contains(dom, "<dt>ran for</dt>") || strings.Contains(dom, "<dt>next attempt</dt>") {
		fail("the ended job's facts do not say how long it ran and when it ended, or still show a next attempt")
	}
}
