package cli

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/jobmanager"
)

// dumpLine is a line of state dump as a test reads it.
type dumpLine struct {
	KeyGroup    int             `json:"key_group"`
	State       string          `json:"state"`
	Key         json.RawMessage `json:"key"`
	Value       json.RawMessage `json:"value"`
	Undecoded   string          `json:"undecoded"`
	KeyBase64   []byte          `json:"key_base64"`
	ValueBase64 []byte          `json:"value_base64"`
}

func parseDump(t *testing.T, out string) []dumpLine {
	t.Helper()
	var lines []dumpLine
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var d dumpLine
		if err := json.Unmarshal([]byte(l), &d); err != nil {
			t.Fatalf("dump line %q: %v", l, err)
		}
		lines = append(lines, d)
	}
	return lines
}

// dumpedCounts checks every line of a wordcount counter dump is a decoded
// "count" entry and returns the counts by word.
func dumpedCounts(t *testing.T, out string) map[string]int {
	t.Helper()
	got := map[string]int{}
	for _, d := range parseDump(t, out) {
		var word string
		var n int
		if d.State != "count" || d.Undecoded != "" || json.Unmarshal(d.Key, &word) != nil || json.Unmarshal(d.Value, &n) != nil {
			t.Fatalf("dump line %+v: want a decoded count", d)
		}
		if _, dup := got[word]; dup {
			t.Fatalf("word %q dumped twice", word)
		}
		got[word] = n
	}
	return got
}

func sameCounts(t *testing.T, what string, got, want map[string]int) {
	t.Helper()
	for w, n := range want {
		if got[w] != n {
			t.Errorf("%s: %q counted %d, the input has %d", what, w, got[w], n)
		}
	}
	for w := range got {
		if _, ok := want[w]; !ok {
			t.Errorf("%s: %q is not in the input", what, w)
		}
	}
}

// inspectJSON runs savepoint inspect -o json.
func inspectJSON(t *testing.T, args ...string) inspection {
	t.Helper()
	out, errOut, err := runCLI(t, append([]string{"savepoint", "inspect", "-o", "json"}, args...)...)
	if err != nil {
		t.Fatalf("inspect %v: %v\n%s", args, err, errOut)
	}
	var in inspection
	if err := json.Unmarshal([]byte(out), &in); err != nil {
		t.Fatalf("inspect output: %v\n%s", err, out)
	}
	return in
}

// checkWordcountInspection checks what inspect says of a wordcount
// snapshot against the checkpoint c it was read from.
func checkWordcountInspection(t *testing.T, in inspection, c checkpoint.Completed, at time.Time, words int) {
	t.Helper()
	if in.Job != c.Job || in.Checkpoint != uint64(c.ID) || !in.Time.Equal(at) || in.Bytes != c.Size() {
		t.Fatalf("inspection %+v of checkpoint %s/%d at %v, %d bytes", in, c.Job, c.ID, c.CompletedAt, c.Size())
	}
	var uids []string
	for _, o := range in.Operators {
		uids = append(uids, o.UID)
	}
	if !slices.Equal(uids, []string{"count", "counts", "lines", "split"}) {
		t.Fatalf("operators %v", uids)
	}
	count := in.Operators[0]
	if count.Parallelism != 2 || count.MaxParallelism != 128 || len(count.Subtasks) != 2 ||
		count.Subtasks[0].KeyGroups != "0-63" || count.Subtasks[1].KeyGroups != "64-127" ||
		count.Subtasks[0].KeyGroupCount != 64 {
		t.Fatalf("count operator %+v", count)
	}
	if len(count.States) != 1 || count.States[0].Name != "count" || count.States[0].Entries != int64(words) || count.States[0].Bytes <= 0 {
		t.Fatalf("count states %+v, want one with %d entries", count.States, words)
	}
	var want []checkpoint.TxnHandle
	for _, ts := range c.Tasks {
		for _, op := range ts.Operators {
			if op.UID == "counts" {
				want = append(want, op.Handles...)
			}
		}
	}
	got := in.Operators[1].Handles
	key := func(h checkpoint.TxnHandle) string {
		return fmt.Sprintf("%s/%d/%d", h.TransactionalID, h.ProducerID, h.Epoch)
	}
	gk, wk := make([]string, 0, len(got)), make([]string, 0, len(want))
	for _, h := range got {
		gk = append(gk, key(h))
	}
	for _, h := range want {
		wk = append(wk, key(h))
	}
	slices.Sort(gk)
	slices.Sort(wk)
	if !slices.Equal(gk, wk) {
		t.Fatalf("pending transactions of the sink %v, the checkpoint holds %v", gk, wk)
	}
}

// Wordcount run in this process on a checkpoint dir over known input:
// the retained checkpoint, the same in a job manager's data-dir layout
// (job type and parameters from its job store), and a savepoint written
// from it with its job type are inspected (operators, key groups, state
// entries, pending transactions equal to the checkpoint's) and dumped:
// every word's count equals the count computed from the input, every
// word once. Without a job type the dump still lists every word, as
// undecoded bytes.
func TestInspectAndDumpOfAWordcountCheckpointMatchTheInputWordByWord(t *testing.T) {
	env := kafkatest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(env.Addr), kgo.DefaultProduceTopic("lines"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 4, 1, nil, "lines"); err != nil {
		t.Fatal(err)
	}
	var lines []string
	var recs []*kgo.Record
	for i := range 800 {
		lines = append(lines, kafkatest.InputLine(i))
		recs = append(recs, kgo.StringRecord(lines[i]))
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	want := wordcount.Expected(lines)
	total := 0
	for _, n := range want {
		total += n
	}

	dir := t.TempDir()
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	var runOut, runErr bytes.Buffer
	done := make(chan error, 1)
	go func() {
		root := newRootCmd(testRegistry(t), &runOut, &runErr)
		root.SetArgs([]string{"run", "wordcount", "--set", "brokers=" + env.Addr, "--set", "group=wc", "--parallelism", "2",
			"--checkpoint-interval", "50ms", "--checkpoint-dir", dir, "--log-level", "warn"})
		done <- root.ExecuteContext(runCtx)
	}()
	for {
		out, err := kafkatest.ReadCommitted(ctx, []string{env.Addr}, "counts")
		if err == nil && len(out) >= total {
			if rep := wordcount.Check(out, want); !rep.OK() {
				t.Fatalf("wordcount output: %s", rep)
			}
			break
		}
		select {
		case err := <-done:
			t.Fatalf("run ended (%v) before its output was committed; stderr:\n%s", err, runErr.String())
		case <-ctx.Done():
			t.Fatalf("output did not reach %d records; stderr:\n%s", total, runErr.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
	// A job manager has the store open: inspection is refused, clearly.
	_, _, err = runCLI(t, "savepoint", "inspect", dir)
	if !errors.Is(err, checkpoint.ErrStoreLocked) {
		t.Fatalf("inspect while the job runs: %v, want the store in use", err)
	}
	stopRun()
	if err := <-done; err != nil {
		t.Fatalf("run: %v; stderr:\n%s", err, runErr.String())
	}

	store, err := checkpoint.OpenStore(filepath.Join(dir, "checkpoints"), checkpoint.ReadOnly())
	if err != nil {
		t.Fatal(err)
	}
	idFile, err := os.ReadFile(filepath.Join(dir, jobIDFile))
	if err != nil {
		t.Fatal(err)
	}
	jobID := strings.TrimSpace(string(idFile))
	c, err := store.Latest(ctx, jobID)
	if cerr := store.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}

	// The retained checkpoint of the run dir.
	checkWordcountInspection(t, inspectJSON(t, dir), c, c.CompletedAt, len(want))
	out, _, err := runCLI(t, "state", "dump", dir, "--operator", "count", "--job", "wordcount", "--set", "brokers="+env.Addr)
	if err != nil {
		t.Fatal(err)
	}
	sameCounts(t, "run dir checkpoint", dumpedCounts(t, out), want)

	// Without a job type: every word, as bytes marked undecoded.
	out, errOut, err := runCLI(t, "state", "dump", dir, "--operator", "count")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errOut, "records no job type") {
		t.Errorf("stderr %q: want the note that no job type is known", errOut)
	}
	raw := map[string]int{}
	for _, d := range parseDump(t, out) {
		if !strings.HasPrefix(d.Undecoded, "no codec") || d.Key != nil || len(d.ValueBase64) != 8 {
			t.Fatalf("raw dump line %+v", d)
		}
		raw[string(d.KeyBase64)]++
	}
	if len(raw) != len(want) {
		t.Fatalf("raw dump: %d keys, want %d", len(raw), len(want))
	}

	// A job manager data dir: the job's type and parameters come from its
	// job store.
	jmDir := t.TempDir()
	if err := os.CopyFS(filepath.Join(jmDir, "checkpoints"), os.DirFS(filepath.Join(dir, "checkpoints"))); err != nil {
		t.Fatal(err)
	}
	js, err := jobmanager.OpenJobStore(filepath.Join(jmDir, "jobs"))
	if err != nil {
		t.Fatal(err)
	}
	params := map[string]string{"brokers": env.Addr, "group": "wc", "parallelism": "2"}
	err = js.Put(jobmanager.JobRecord{ID: jobID, Type: wordcount.Name, Params: params, State: jobmanager.StateCanceled})
	if cerr := js.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	in := inspectJSON(t, jmDir, "--job-id", jobID, "--checkpoint", fmt.Sprint(c.ID))
	checkWordcountInspection(t, in, c, c.CompletedAt, len(want))
	if in.Kind != "checkpoint" || in.JobType != wordcount.Name || !maps.Equal(in.JobParams, params) {
		t.Fatalf("job manager dir inspection: kind %q type %q params %v", in.Kind, in.JobType, in.JobParams)
	}
	out, _, err = runCLI(t, "state", "dump", jmDir, "--operator", "count", "--state", "count")
	if err != nil {
		t.Fatal(err)
	}
	sameCounts(t, "job manager checkpoint", dumpedCounts(t, out), want)

	// A savepoint written with its job type.
	sp := filepath.Join(t.TempDir(), "sp")
	written := time.Now().UTC()
	if err := checkpoint.WriteSavepoint(t.Context(), sp, c, written, checkpoint.WithJob(wordcount.Name, params)); err != nil {
		t.Fatal(err)
	}
	in = inspectJSON(t, sp)
	checkWordcountInspection(t, in, c, written, len(want))
	if in.Kind != "savepoint" || in.FormatVersion != checkpoint.SavepointVersion || in.JobType != wordcount.Name {
		t.Fatalf("savepoint inspection: kind %q version %d type %q", in.Kind, in.FormatVersion, in.JobType)
	}
	out, _, err = runCLI(t, "state", "dump", sp, "--operator", "count")
	if err != nil {
		t.Fatal(err)
	}
	sameCounts(t, "savepoint", dumpedCounts(t, out), want)
	table, _, err := runCLI(t, "savepoint", "inspect", sp)
	if err != nil || !strings.Contains(table, "Operator count") || !strings.Contains(table, "count  ") {
		t.Fatalf("table output (%v):\n%s", err, table)
	}
	t.Logf("%d lines, %d words, %d counts: checkpoint %d dumped word by word from the run dir, a job manager dir and a savepoint",
		len(lines), len(want), total, c.ID)
}

// frame is a uvarint length and b, as keyed state blobs frame their parts.
func frame(dst, b []byte) []byte { return append(binary.AppendUvarint(dst, uint64(len(b))), b...) }

// smallSavepoint writes a savepoint of two operators: "count", keyed (one
// string key "fox" with the int64 value 7 in key group 3 of subtask 0 of
// 2), and "sink", with operator state and a pending transaction.
func smallSavepoint(t *testing.T) string {
	t.Helper()
	val := binary.BigEndian.AppendUint64(nil, 7)
	state := frame(frame(binary.AppendUvarint(nil, 1), []byte("fox")), val)
	blob := frame(frame(nil, []byte("count")), state)
	wm := int64(1_764_849_600_000)
	c := checkpoint.Completed{Job: "job-1", ID: 9, Tasks: map[checkpoint.TaskID]checkpoint.TaskSnapshot{
		"count#0": {Task: "count#0", Operators: []checkpoint.OperatorSnapshot{{UID: "count", Subtask: 0, Parallelism: 2, MaxParallelism: 8,
			KeyGroups: map[int][]byte{3: blob}}}},
		"count#1": {Task: "count#1", Operators: []checkpoint.OperatorSnapshot{{UID: "count", Subtask: 1, Parallelism: 2, MaxParallelism: 8}}},
		"sink#0": {Task: "sink#0", Operators: []checkpoint.OperatorSnapshot{{UID: "sink", Parallelism: 1, State: [][]byte{[]byte("entry")}, Watermark: &wm,
			Handles: []checkpoint.TxnHandle{{TransactionalID: "weir-job-1-sink-0", ProducerID: 4001, Epoch: 3, Checkpoint: 9,
				Partitions: []checkpoint.TxnPartition{{Topic: "out", Partition: 2, FirstOffset: 40}}}}}}},
	}}
	dir := filepath.Join(t.TempDir(), "sp")
	if err := checkpoint.WriteSavepoint(t.Context(), dir, c, time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Inspection reports a savepoint's key-group ranges, state sizes and
// pending transactions as written; a dump of its keyed state without a
// job type gives every entry as bytes; an unknown operator uid is an
// error listing the uids there are.
func TestInspectReportsKeyGroupsStatesAndPendingTransactions(t *testing.T) {
	sp := smallSavepoint(t)
	in := inspectJSON(t, sp)
	if in.Job != "job-1" || in.Checkpoint != 9 || in.FormatVersion != 1 || len(in.Operators) != 2 {
		t.Fatalf("inspection %+v", in)
	}
	count, sink := in.Operators[0], in.Operators[1]
	if count.MaxParallelism != 8 || len(count.Subtasks) != 2 || count.Subtasks[0].KeyGroups != "0-3" || count.Subtasks[1].KeyGroups != "4-7" ||
		count.Subtasks[0].KeyGroupsWithState != 1 || len(count.States) != 1 || count.States[0] != (inspectedState{Name: "count", Bytes: 14, Entries: 1}) {
		t.Fatalf("count %+v", count)
	}
	if len(sink.Handles) != 1 || sink.Handles[0].TransactionalID != "weir-job-1-sink-0" || sink.Handles[0].ProducerID != 4001 ||
		sink.Handles[0].Epoch != 3 || len(sink.Handles[0].Partitions) != 1 || sink.Subtasks[0].OperatorStateEntries != 1 ||
		sink.Subtasks[0].Watermark == nil || *sink.Subtasks[0].Watermark != 1_764_849_600_000 || count.Subtasks[0].Watermark != nil {
		t.Fatalf("sink %+v", sink)
	}
	table, _, err := runCLI(t, "savepoint", "inspect", sp)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Format version  1", "0-3 (4)", "weir-job-1-sink-0", "producer 4001 epoch 3", "out/2@40", "1764849600000"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	out, _, err := runCLI(t, "state", "dump", sp, "--operator", "count")
	if err != nil {
		t.Fatal(err)
	}
	lines := parseDump(t, out)
	if len(lines) != 1 || lines[0].KeyGroup != 3 || string(lines[0].KeyBase64) != "fox" || !bytes.Equal(lines[0].ValueBase64, binary.BigEndian.AppendUint64(nil, 7)) {
		t.Fatalf("dump %+v", lines)
	}
	_, _, err = runCLI(t, "state", "dump", sp, "--operator", "counter")
	if err == nil || !strings.Contains(err.Error(), `no operator "counter"`) || !strings.Contains(err.Error(), "count, sink") {
		t.Fatalf("unknown uid: %v", err)
	}
}

// A damaged savepoint (each file: _metadata missing, truncated, its
// checksum or header broken, a later format; a state file missing,
// truncated or with a flipped byte) fails inspect and dump with one error
// line naming the file, and prints nothing.
func TestDamagedSavepointFailsInspectAndDumpWithOneErrorNamingTheFile(t *testing.T) {
	state := filepath.Join("state", "count.bin")
	edit := func(name string, fn func([]byte) []byte) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			p := filepath.Join(dir, name)
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, fn(b), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	remove := func(name string) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	flipLast := func(b []byte) []byte { b[len(b)-2] ^= 0x20; return b }
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, dir string)
		file   string
		is     error
	}{
		{"metadata missing", remove(checkpoint.SavepointMetadataFile), checkpoint.SavepointMetadataFile, errNotSnapshot},
		{"metadata truncated", edit(checkpoint.SavepointMetadataFile, func(b []byte) []byte { return b[:len(b)-7] }), checkpoint.SavepointMetadataFile, checkpoint.ErrCorruptSavepoint},
		{"metadata checksum", edit(checkpoint.SavepointMetadataFile, flipLast), checkpoint.SavepointMetadataFile, checkpoint.ErrCorruptSavepoint},
		{"metadata header", edit(checkpoint.SavepointMetadataFile, func(b []byte) []byte { return append([]byte("x"), b...) }), checkpoint.SavepointMetadataFile, checkpoint.ErrCorruptSavepoint},
		{"metadata from a later format", edit(checkpoint.SavepointMetadataFile, func(b []byte) []byte {
			return bytes.Replace(b, []byte("weir-savepoint 1 "), []byte("weir-savepoint 9 "), 1)
		}), checkpoint.SavepointMetadataFile, checkpoint.ErrSavepointVersion},
		{"state file missing", remove(state), "state/count.bin", checkpoint.ErrCorruptSavepoint},
		{"state file truncated", edit(state, func(b []byte) []byte { return b[:len(b)-1] }), "state/count.bin", checkpoint.ErrCorruptSavepoint},
		{"state file checksum", edit(state, flipLast), "state/count.bin", checkpoint.ErrCorruptSavepoint},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := smallSavepoint(t)
			tc.damage(t, sp)
			for _, args := range [][]string{{"savepoint", "inspect", sp}, {"savepoint", "inspect", "-o", "json", sp}, {"state", "dump", sp, "--operator", "count"}} {
				out, errOut, err := runCLI(t, args...)
				if !errors.Is(err, tc.is) {
					t.Fatalf("%v: %v, want %v", args, err, tc.is)
				}
				if msg := err.Error(); !strings.Contains(msg, tc.file) || strings.Contains(msg, "\n") {
					t.Fatalf("%v: error %q: want one line naming %s", args, msg, tc.file)
				}
				if out != "" {
					t.Fatalf("%v printed %q", args, out)
				}
				if args[0] == "state" {
					t.Logf("%v", err)
				}
				if n := strings.Count(strings.TrimSpace(errOut), "\n"); n != 0 {
					t.Fatalf("%v: stderr has %d lines:\n%s", args, n+1, errOut)
				}
			}
		})
	}
}
