package wordcount_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
)

// The input is written in transactions: committed ones, aborted ones between
// them, and one left open while the job runs, then aborted. The wordcount,
// built with the defaults users get (two subtasks, several lanes each,
// renewals on), must count exactly the committed lines: every word of them
// 1..n, read_committed, and no word of an aborted or open transaction. So
// must the wordcount on the partition source (source=kafka).
func TestWordcountCountsOnlyCommittedInput(t *testing.T) {
	for _, source := range []string{"sharegroup", "kafka"} {
		t.Run("source="+source, func(t *testing.T) { countsOnlyCommittedInput(t, source) })
	}
}

func countsOnlyCommittedInput(t *testing.T, source string) {
	env := kafkatest.New(t)
	env.CreateTopic(t, "lines", 4, nil)
	lines := corpus(2000)
	var committed []string
	// txns writes lines[from:to] in committed transactions of 100 lines,
	// each followed by an aborted one of 30 lines whose words are nowhere
	// in the committed input.
	txns := func(from, to int) {
		for i := from; i < to; i += 100 {
			var recs, ghosts []*kgo.Record
			for k, l := range lines[i:min(i+100, to)] {
				recs = append(recs, &kgo.Record{Topic: "lines", Key: []byte(strconv.Itoa(i + k)), Value: []byte(l)})
				committed = append(committed, l)
			}
			for k := range 30 {
				ghosts = append(ghosts, &kgo.Record{Topic: "lines", Key: []byte(strconv.Itoa(i + k)),
					Value: fmt.Appendf(nil, "aborted%d the quick ghost%d", i, k%7)})
			}
			env.WriteTxn(t, "input-committer", true, recs...)
			env.WriteTxn(t, "input-aborter", false, ghosts...)
		}
	}
	var open []*kgo.Record
	for k := range 40 {
		open = append(open, &kgo.Record{Topic: "lines", Key: []byte(strconv.Itoa(k)), Value: fmt.Appendf(nil, "open%d the lazy dog", k)})
	}
	endOpen := env.OpenTxn(t, "input-open", open...)
	txns(0, 1000)

	reg := runtime.NewRegistry()
	if err := wordcount.Register(reg); err != nil {
		t.Fatal(err)
	}
	job, err := reg.Build("wordcount", map[string]string{"brokers": env.Addr, "parallelism": "2", "source": source})
	if err != nil {
		t.Fatal(err)
	}
	// Once the job runs: the open transaction is aborted, and the second
	// half of the input arrives the same way as the first.
	wrote := false
	settled := func() bool {
		if !wrote {
			wrote = true
			endOpen(false)
			txns(1000, len(lines))
		}
		return true
	}
	want := wordcount.Expected(lines) // every line is committed once settled ran
	runUntil(t, env, job, want, settled, runtime.CheckpointInterval(100*time.Millisecond))
	if len(committed) != len(lines) {
		t.Fatalf("%d lines committed, want %d", len(committed), len(lines))
	}
	rep := wordcount.Check(env.ReadCommitted(t, "counts"), want)
	if !rep.OK() {
		t.Fatal(rep)
	}
	t.Log(rep)
}
