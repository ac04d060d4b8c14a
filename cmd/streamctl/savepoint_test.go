package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/proctest"
)

// stopWithSavepoint stops job id with a savepoint under dir, checks that
// it printed the savepoint's directory and that the job FINISHED, and
// returns the directory.
func (c *procCluster) stopWithSavepoint(id, dir string) string {
	c.t.Helper()
	out, err := c.Run("stop", id, "--savepoint", dir)
	if err != nil {
		c.t.Fatalf("stop %s: %v; %s", id, err, c.Logs(60))
	}
	sp := strings.TrimSpace(out)
	if filepath.Dir(sp) != dir {
		c.t.Fatalf("stop printed %q, want a directory under %s", out, dir)
	}
	if _, err := os.Stat(filepath.Join(sp, "_metadata")); err != nil {
		c.t.Fatalf("savepoint %s: %v", sp, err)
	}
	if st := c.Status(id); st.State != "FINISHED" {
		c.t.Fatalf("job %s after stop: %+v, want FINISHED", id, st)
	}
	return sp
}

// Wordcount as processes, stopped with a savepoint, resumed from it at
// another parallelism, stopped again and resumed with an operator added
// (min-length=1 adds a filter, UID filter, that keeps every word): every
// word is counted 1..n once, read_committed, across the three jobs. A
// savepoint holding state of operators a job does not have is refused at
// submit, naming them.
func TestWordcountStoppedWithASavepointResumesAtAnotherParallelismAndWithAnOperatorAdded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	c := newProcCluster(t, streamctlBin)
	c.twoTMs()
	// Under the job manager's --data-dir: an allowed savepoint location.
	spDir := filepath.Join(c.DataDir, "savepoints")
	in := newInput(t, ctx, c.env.Addr, "lines", 300)
	in.run(ctx)
	args := wordcountArgs(c.env.Addr, "wc", "lines", "counts")

	id1 := c.Submit(args...)
	n1 := len(c.waitOutput(ctx, "counts", 600))
	sp1 := c.stopWithSavepoint(id1, spDir)

	id2 := c.Submit(append(args, "--parallelism", "3", "--from-savepoint", sp1)...)
	n2 := len(c.waitOutput(ctx, "counts", n1+600))
	sp2 := c.stopWithSavepoint(id2, spDir)

	// A job without the savepoint's operators is refused, naming them.
	out, err := c.Run("submit", "sessions", "--set", "brokers="+c.env.Addr, "--from-savepoint", sp2)
	if err == nil || !strings.Contains(err.Error(), "count") || !strings.Contains(err.Error(), "allow non-restored state") {
		t.Fatalf("submit sessions from a wordcount savepoint: %q, %v; want a refusal naming the wordcount operators", out, err)
	}

	id3 := c.Submit(append(args, "--set", "min-length=1", "--from-savepoint", sp2)...)
	c.waitOutput(ctx, "counts", n2+600)
	in.halt()
	total := c.verify(ctx, "lines", "counts")
	if st := c.Status(id3); st.State != "RUNNING" || st.Restarts != 0 {
		t.Fatalf("job %s: %+v, want RUNNING without restarts", id3, st)
	}
	t.Logf("%d lines, %d output records: %d by the first job, %d by the second (parallelism 3), the rest by the third (with a filter)",
		in.n, total, n1, n2-n1)
}

// A savepoint copied to another directory starts the job on a fresh
// cluster (a new job manager data directory: its store never saw the
// savepoint) exactly-once; a truncated copy is refused with one error
// naming the file, and no job is created.
func TestSavepointCopiedToAFreshClusterRestoresExactlyOnceAndADamagedOneIsRefused(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	c := newProcCluster(t, streamctlBin)
	c.twoTMs()
	in := newInput(t, ctx, c.env.Addr, "lines", 300)
	in.run(ctx)
	args := wordcountArgs(c.env.Addr, "wc", "lines", "counts")
	id1 := c.Submit(args...)
	n1 := len(c.waitOutput(ctx, "counts", 600))
	sp := c.stopWithSavepoint(id1, filepath.Join(c.DataDir, "savepoints"))
	for _, p := range []*proctest.Proc{c.TMs["tm-a"], c.TMs["tm-b"], c.JM} {
		p.Stop(t)
	}

	// Copied under the fresh job manager's --data-dir, a location it
	// allows.
	fresh := &procCluster{Cluster: proctest.NewCluster(t, streamctlBin), t: t, env: c.env}
	moved := filepath.Join(fresh.DataDir, "copied")
	damaged := filepath.Join(fresh.DataDir, "damaged")
	for _, dst := range []string{moved, damaged} {
		if out, err := exec.Command("cp", "-r", sp, dst).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v: %s", err, out)
		}
	}
	count := filepath.Join(damaged, "state", "count.bin")
	fi, err := os.Stat(count)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(count, fi.Size()/2); err != nil {
		t.Fatal(err)
	}

	fresh.twoTMs()
	out, err := fresh.Run(append([]string{"submit"}, append(args, "--from-savepoint", damaged)...)...)
	if err == nil || !strings.Contains(err.Error(), "corrupt savepoint") || !strings.Contains(err.Error(), "state/count.bin") ||
		!strings.Contains(err.Error(), "truncated") {
		t.Fatalf("submit from a truncated savepoint: %q, %v; want one error naming state/count.bin", out, err)
	}
	if list, err := fresh.Run("list", "--output", "json"); err != nil || strings.Contains(list, `"id"`) {
		t.Fatalf("list after the refused submit: %q, %v; want no job", list, err)
	}

	fresh.Submit(append(args, "--from-savepoint", moved)...)
	fresh.waitOutput(ctx, "counts", n1+600)
	in.halt()
	total := fresh.verify(ctx, "lines", "counts")
	t.Logf("%d lines, %d output records, %d of them before the stop", in.n, total, n1)
}

// Share groups cannot rewind: a savepoint taken while the job went on and
// committed later checkpoints' acknowledgements is refused at submit (no
// job is created: the committed output does not change), and the latest
// savepoint of the job then continues it exactly-once, record by record.
func TestAnOlderSavepointAfterLaterAcknowledgementsCommittedIsRefused(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	c := newProcCluster(t, streamctlBin)
	c.twoTMs()
	dir := filepath.Join(c.DataDir, "savepoints")
	in := newInput(t, ctx, c.env.Addr, "lines", 300)
	in.run(ctx)
	args := wordcountArgs(c.env.Addr, "wc", "lines", "counts")
	id1 := c.Submit(args...)
	n1 := len(c.waitOutput(ctx, "counts", 600))
	out, err := c.Run("savepoint", id1, "--target", dir)
	if err != nil {
		t.Fatal(err)
	}
	older := strings.TrimSpace(out)
	c.waitOutput(ctx, "counts", n1+900) // later checkpoints commit their acknowledgements
	latest := c.stopWithSavepoint(id1, dir)
	stopped := len(committed(t, ctx, c.env.Addr, "counts"))

	c.refusedBehindAcks(ctx, args, older, stopped)

	c.Submit(append(args, "--from-savepoint", latest)...)
	c.waitOutput(ctx, "counts", stopped+600)
	in.halt()
	total := c.verify(ctx, "lines", "counts")
	t.Logf("%d lines, %d output records; %d when the older savepoint was taken, %d at the stop", in.n, total, n1, stopped)
}

// refusedBehindAcks submits a job from savepoint sp and checks that the
// submit is refused, saying why and what to do, that no job was created
// besides the jobs listed before, and that the committed output still
// holds the stopped records it held.
func (c *procCluster) refusedBehindAcks(ctx context.Context, args []string, sp string, stopped int) {
	c.t.Helper()
	before, err := c.Run("list", "--output", "json")
	if err != nil {
		c.t.Fatal(err)
	}
	out, err := c.Run(append([]string{"submit"}, append(args, "--from-savepoint", sp)...)...)
	c.t.Logf("submit from %s: %v", sp, err)
	if err == nil || !strings.Contains(err.Error(), "savepoint older than the share group's committed acknowledgements") ||
		!strings.Contains(err.Error(), "restore the latest savepoint") {
		c.t.Fatalf("submit from the older savepoint %s: %q, %v; want a refusal saying why and what to do", sp, out, err)
	}
	if after, err := c.Run("list", "--output", "json"); err != nil || after != before {
		c.t.Fatalf("jobs after the refused submit: %q (%v), before: %q; want no new job", after, err, before)
	}
	if now := len(committed(c.t, ctx, c.env.Addr, "counts")); now != stopped {
		c.t.Fatalf("the refused submit changed the output: %d records after the stop, %d after the refusal", stopped, now)
	}
}

// The blind spot of a check that knew only the restored markers: a
// savepoint taken while the source had acknowledged nothing in its epoch
// (the input was idle) holds no marker, yet carries the share group's
// lineage position. Once later checkpoints committed acknowledgements, it
// is refused at submit and by run (nothing changes, nothing is lost); the job's
// latest savepoint, taken idle as well, continues it exactly-once: every
// word counted 1..n once, read_committed.
func TestASavepointTakenWhileIdleIsRefusedAfterLaterAcknowledgements(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	c := newProcCluster(t, streamctlBin)
	c.twoTMs()
	dir := filepath.Join(c.DataDir, "savepoints")
	in := newInput(t, ctx, c.env.Addr, "lines", 300)
	args := wordcountArgs(c.env.Addr, "wc", "lines", "counts")
	id1 := c.Submit(args...)
	c.verify(ctx, "lines", "counts") // every line counted: the next epochs read nothing
	out, err := c.Run("savepoint", id1, "--target", dir)
	if err != nil {
		t.Fatal(err)
	}
	idle := strings.TrimSpace(out)
	if err := in.produce(ctx, 300); err != nil { // later checkpoints acknowledge these
		t.Fatal(err)
	}
	c.verify(ctx, "lines", "counts")
	latest := c.stopWithSavepoint(id1, dir) // idle too
	stopped := len(committed(t, ctx, c.env.Addr, "counts"))

	c.refusedBehindAcks(ctx, args, idle, stopped)
	// run refuses it too, before the first attempt opens anything.
	run := startClusterEnv(t, nil, append([]string{"run"}, append(args, "--from-savepoint", idle)...)...)
	select {
	case <-run.Done:
	case <-ctx.Done():
		t.Fatalf("run from the older savepoint did not end; stderr:\n%s", run.Stderr.Tail(40))
	}
	if code := run.Cmd.ProcessState.ExitCode(); code == 0 || !strings.Contains(run.Stderr.String(), "savepoint older than the share group's committed acknowledgements") {
		t.Fatalf("run from the older savepoint: exit code %d, want a refusal; stderr:\n%s", code, run.Stderr.Tail(40))
	}
	if now := len(committed(t, ctx, c.env.Addr, "counts")); now != stopped {
		t.Fatalf("the refused run changed the output: %d records after the stop, %d after the refusal", stopped, now)
	}

	id2 := c.Submit(append(args, "--parallelism", "3", "--from-savepoint", latest)...)
	if err := in.produce(ctx, 300); err != nil {
		t.Fatal(err)
	}
	total := c.verify(ctx, "lines", "counts")
	if st := c.Status(id2); st.State != "RUNNING" || st.Restarts != 0 {
		t.Fatalf("job %s from the latest savepoint: %+v, want RUNNING without restarts", id2, st)
	}
	t.Logf("%d lines, %d output records, %d at the stop", in.n, total, stopped)
}

// The partition source (source=kafka) rewinds, as Flink's KafkaSource: a
// savepoint taken while the job ran, older than everything it committed
// later, is accepted by submit (the share group's refusal does not apply),
// and with a bounded stop (stop=latest) the restored job reprocesses the
// input from the savepoint's offsets to the end offsets it found at its
// start, then ends FINISHED. savepoint inspect shows each input partition's
// offset; record by record, the reprocessing's output continues each
// word's count from the savepoint's state: the words of the lines before
// those offsets are its restored counts k, and it emits exactly k+1..n.
func TestAnOlderSavepointOfThePartitionSourceReprocessesToABoundedStopAndFinishes(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	c := newProcCluster(t, streamctlBin)
	c.twoTMs()
	dir := filepath.Join(c.DataDir, "savepoints")
	in := newInput(t, ctx, c.env.Addr, "lines", 300)
	in.run(ctx)
	onKafka := func(out string, set ...string) []string {
		args := append(wordcountArgs(c.env.Addr, "wck", "lines", out), "--set", "source=kafka")
		for _, s := range set {
			args = append(args, "--set", s)
		}
		return args
	}
	id1 := c.Submit(onKafka("counts")...)
	n1 := len(c.waitOutput(ctx, "counts", 600))
	out, err := c.Run("savepoint", id1, "--target", dir)
	if err != nil {
		t.Fatal(err)
	}
	older := strings.TrimSpace(out)
	c.waitOutput(ctx, "counts", n1+900) // later checkpoints commit, and commit offsets to the group
	in.halt()
	total := c.verify(ctx, "lines", "counts")
	if _, err := c.Run("cancel", id1); err != nil {
		t.Fatal(err)
	}

	// Each input partition's offset in the older savepoint.
	inspect := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(streamctlBin, append([]string{"savepoint", "inspect", older}, args...)...).Output()
		if err != nil {
			t.Fatalf("savepoint inspect %s %v: %v", older, args, err)
		}
		return string(out)
	}
	js := inspect("--output", "json")
	var insp struct {
		Operators []struct {
			UID     string `json:"uid"`
			Offsets []struct {
				Topic     string `json:"topic"`
				Partition int32  `json:"partition"`
				Offset    int64  `json:"offset"`
			} `json:"partition_offsets"`
		} `json:"operators"`
	}
	if err := json.Unmarshal([]byte(js), &insp); err != nil {
		t.Fatalf("inspect --output json: %v: %s", err, js)
	}
	at := map[int32]int64{}
	for _, op := range insp.Operators {
		for _, o := range op.Offsets {
			if op.UID != "lines" || o.Topic != "lines" {
				t.Fatalf("inspect shows partition offsets of operator %s, topic %s; want only the source's (lines): %s", op.UID, o.Topic, js)
			}
			at[o.Partition] = o.Offset
		}
	}
	if len(at) != 4 {
		t.Fatalf("inspect shows offsets of partitions %v, want lines' 4: %s", at, js)
	}
	if table := inspect(); !regexp.MustCompile(`(?m)^\s+lines/0\s+\d+\s+\d+$`).MatchString(table) {
		t.Fatalf("inspect (table): want a line per partition with its offset:\n%s", table)
	}

	// The words of the lines before the savepoint's offsets are its
	// counts; all the lines make the final counts.
	lines := committed(t, ctx, c.env.Addr, "lines")
	before, all := map[string]int{}, map[string]int{}
	read := 0
	for _, r := range lines {
		for _, w := range wordcount.Words(string(r.Value)) {
			all[w]++
			if r.Offset < at[r.Partition] {
				before[w]++
			}
		}
		if r.Offset < at[r.Partition] {
			read++
		}
	}
	if read == 0 || read == len(lines) {
		t.Fatalf("the older savepoint's offsets %v cover %d of %d lines; want a savepoint taken mid-way", at, read, len(lines))
	}

	id2 := c.Submit(append(onKafka("recounts", "stop=latest"), "--from-savepoint", older)...)
	st := c.WaitStatus(id2, "the reprocessing finished", func(s proctest.JobStatus) bool {
		return s.State == "FINISHED" || s.State == "FAILED" || s.State == "CANCELED"
	})
	if st.State != "FINISHED" || st.Restarts != 0 {
		t.Fatalf("the reprocessing job: %+v, want FINISHED without restarts; %s", st, c.Logs(60))
	}
	// Record by record, in offset order per word: k+1..n.
	next := map[string]int{}
	for w, k := range before {
		next[w] = k + 1
	}
	recs := committed(t, ctx, c.env.Addr, "recounts")
	bad := 0
	for _, r := range recs {
		w := string(r.Key)
		if next[w] == 0 {
			next[w] = 1
		}
		if got := string(r.Value); got != strconv.Itoa(next[w]) {
			if bad++; bad <= 5 {
				t.Errorf("recounts: word %q counted %s, want %d", w, got, next[w])
			}
		}
		next[w]++
	}
	for w, n := range all {
		if next[w]-1 != n {
			if bad++; bad <= 10 {
				t.Errorf("recounts: word %q ends at %d, want %d", w, next[w]-1, n)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d problems in %d reprocessed records", bad, len(recs))
	}
	t.Logf("%d lines, %d counted by the first job (%d when the older savepoint was taken, offsets %v); the reprocessing read %d lines and emitted %d records, then FINISHED",
		len(lines), total, n1, at, len(lines)-read, len(recs))
}
