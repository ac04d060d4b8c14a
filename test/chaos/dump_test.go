package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// roundTopics are a round's topics: the input, the uppercase job's output
// (the chained job's input) and the two wordcounts' outputs.
type roundTopics struct{ in, up, cnt, cnt2 string }

// dump writes what a failed round leaves for its diagnosis into a directory
// of its own under WEIR_CHAOS_DUMP (nothing when it is unset): every
// process's whole log, the ones this round replaced included; the jobs'
// REST details, checkpoints and exceptions; each topic's end and last
// stable offsets and each share group's start offsets; each group's
// ack-log, decoded (markers with their ranges, watermarks, transaction
// markers, tombstones); and, for each output that lacks records, the input
// records it did not count, with their partition and offset. A failure
// message carries only the logs' last lines, and a dead process's not at
// all. A dump that fails is logged, never the round's verdict.
func (w *world) dump(ctx context.Context, i int, jobs []string, tp roundTopics) {
	root := os.Getenv("WEIR_CHAOS_DUMP")
	if root == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	dir := filepath.Join(root, fmt.Sprintf("round-%d-%s", i, time.Now().UTC().Format("150405")))
	var errs []error
	write := func(name, content string) {
		errs = append(errs, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		w.t.Logf("round %d: dump: %v", i, err)
		return
	}
	write("broker.log", w.broker.Stderr())
	write("jobmanager.log", w.cl.JM.Stderr.String())
	for _, id := range taskManagers {
		write(id+".log", w.cl.TMs[id].Stderr.String())
	}
	for k, e := range w.ended {
		write(fmt.Sprintf("ended-%d-%s.log", k, e.name), e.stderr)
	}
	write("rest.txt", w.restDump(ctx, jobs))

	cl, err := kgo.NewClient(w.kafkaOpts()...)
	if err != nil {
		w.t.Logf("round %d: dump: %v", i, err)
		return
	}
	defer cl.Close()
	groups := []string{"wc-" + tp.in, "up-" + tp.in, "wc-" + tp.up}
	offsets, err := offsetsDump(ctx, kadm.NewClient(cl), groups, tp.in, tp.up, tp.cnt, tp.cnt2)
	errs = append(errs, err)
	write("offsets.txt", offsets)
	for _, g := range groups {
		log, err := w.ackLogDump(ctx, acklog.TopicFor(g))
		errs = append(errs, err)
		write("acklog-"+g+".txt", log)
	}
	for _, o := range []struct{ from, to, group string }{{tp.in, tp.up, "up-" + tp.in}, {tp.in, tp.cnt, "wc-" + tp.in},
		{tp.up, tp.cnt2, "wc-" + tp.up}} {
		missing, err := w.missingDump(ctx, o.from, o.to, o.group, o.to == tp.up)
		errs = append(errs, err)
		write("missing-"+o.to+".txt", missing)
	}
	if err := errors.Join(errs...); err != nil {
		w.t.Logf("round %d: dump %s incomplete: %v", i, dir, err)
		return
	}
	w.t.Logf("round %d: dumped to %s", i, dir)
}

// restDump is GET /jobs/{id}, its checkpoints and exceptions for each job,
// and the task managers, from the job manager's REST API.
func (w *world) restDump(ctx context.Context, jobs []string) string {
	var b strings.Builder
	get := func(path string) {
		fmt.Fprintf(&b, "== GET %s\n", path)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+w.cl.HTTPAddr+path, nil)
		if err != nil {
			fmt.Fprintf(&b, "%v\n", err)
			return
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Fprintf(&b, "%v\n", err)
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		fmt.Fprintf(&b, "%s %s %v\n", resp.Status, body, err)
	}
	for _, id := range jobs {
		get("/jobs/" + id)
		get("/jobs/" + id + "/checkpoints?history=50")
		get("/jobs/" + id + "/exceptions")
	}
	get("/taskmanagers")
	return b.String()
}

// offsetsDump lists each partition's end and last stable offsets, and each
// share group's start offsets.
func offsetsDump(ctx context.Context, adm *kadm.Client, groups []string, topics ...string) (string, error) {
	var b strings.Builder
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return "", fmt.Errorf("list end offsets: %w", err)
	}
	stable, err := adm.ListCommittedOffsets(ctx, topics...)
	if err != nil {
		return "", fmt.Errorf("list last stable offsets: %w", err)
	}
	for _, t := range topics {
		for _, p := range slices.Sorted(maps.Keys(ends[t])) {
			e := ends[t][p]
			s, _ := stable.Lookup(t, p)
			fmt.Fprintf(&b, "%s[%d] end %d, last stable %d\n", t, p, e.Offset, s.Offset)
		}
	}
	described, err := adm.DescribeShareGroupOffsets(ctx, groups...)
	if err != nil {
		return b.String(), fmt.Errorf("describe share group offsets: %w", err)
	}
	for _, g := range groups {
		d := described[g]
		fmt.Fprintf(&b, "share group %s: %v\n", g, d.Err)
		for t, ps := range d.Offsets {
			for p, o := range ps {
				fmt.Fprintf(&b, "  %s[%d] start %d %v\n", t, p, o.StartOffset, o.Err)
			}
		}
	}
	return b.String(), nil
}

// readAll reads topic from its start, read_uncommitted with the
// transaction markers, until a poll of 3 s brings nothing.
func (w *world) readAll(ctx context.Context, topic string) ([]*kgo.Record, error) {
	cl, err := kgo.NewClient(append(w.kafkaOpts(), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()), kgo.KeepControlRecords())...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var recs []*kgo.Record
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		if fs.NumRecords() == 0 {
			break
		}
		recs = append(recs, fs.Records()...)
	}
	return recs, ctx.Err()
}

// describe prints a record's place and transactional state.
func describe(r *kgo.Record) string {
	return fmt.Sprintf("%s[%d]@%d producer %d epoch %d transactional %v %s", r.Topic, r.Partition, r.Offset,
		r.ProducerID, r.ProducerEpoch, r.Attrs.IsTransactional(), r.Timestamp.UTC().Format("15:04:05.000"))
}

// ackLogDump decodes every record of an ack-log topic.
func (w *world) ackLogDump(ctx context.Context, topic string) (string, error) {
	recs, err := w.readAll(ctx, topic)
	var b strings.Builder
	for _, r := range recs {
		b.WriteString(describe(r))
		switch {
		case r.Attrs.IsControl():
			kind := "abort"
			if len(r.Key) >= 4 && r.Key[3] == 1 {
				kind = "commit"
			}
			fmt.Fprintf(&b, " %s marker\n", kind)
		case r.Value == nil:
			fmt.Fprintf(&b, " tombstone %q\n", r.Key)
		default:
			if wm, err := acklog.DecodeWatermark(r); err == nil {
				fmt.Fprintf(&b, " watermark %v %d\n", wm.TP, wm.Offset)
			} else if m, err := acklog.Decode(r); err == nil {
				fmt.Fprintf(&b, " ack marker checkpoint %d member %s transaction %s ranges %v\n", m.Checkpoint, m.Member, m.TransactionalID, m.Ranges)
			} else {
				fmt.Fprintf(&b, " undecodable: %v\n", err)
			}
		}
	}
	return b.String(), err
}

// missingDump lists the committed records of from that output to lacks:
// lines (upper, the uppercase job's output) or words (a wordcount's), each
// with where it is in from, read_uncommitted (every copy of it, aborted
// ones included), and what the job's share group (group) and its ack-log
// say of it (explain): which of the explanations of a loss it fits.
func (w *world) missingDump(ctx context.Context, from, to, group string, upper bool) (string, error) {
	committed, err := kafkatest.ReadCommitted(ctx, []string{w.brokerAddr}, from, kgo.Dialer(w.dial))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", from, err)
	}
	out, err := kafkatest.ReadCommitted(ctx, []string{w.brokerAddr}, to, kgo.Dialer(w.dial))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", to, err)
	}
	var vals []string
	for _, r := range committed {
		vals = append(vals, string(r.Value))
	}
	lacks := map[string]bool{} // the values of from whose effect to lacks
	if upper {
		want := map[string]int{}
		for _, v := range vals {
			want[strings.ToUpper(v)]++
		}
		for _, r := range out {
			want[string(r.Value)]--
		}
		for _, v := range vals {
			lacks[v] = want[strings.ToUpper(v)] > 0
		}
	} else {
		want := wordcount.Expected(vals)
		for _, r := range out {
			want[string(r.Key)]--
		}
		for _, v := range vals {
			lacks[v] = slices.ContainsFunc(wordcount.Words(v), func(wd string) bool { return want[wd] > 0 })
		}
	}
	all, err := w.readAll(ctx, from)
	if err != nil {
		return "", err
	}
	var lacking []*kgo.Record
	for _, r := range all {
		if !r.Attrs.IsControl() && lacks[string(r.Value)] {
			lacking = append(lacking, r)
		}
	}
	if len(lacking) == 0 {
		return "", nil
	}
	verdicts, err := explain(ctx, []string{w.brokerAddr}, group, lacking, kgo.Dialer(w.dial))
	var b strings.Builder
	for k, r := range lacking {
		fmt.Fprintf(&b, "%s %q: %s\n", describe(r), r.Value, verdicts[k])
	}
	return b.String(), err
}

// explain says, for each record of a share group's input, what the group
// and the job's ack-log say of it, naming the explanation of a loss it fits
// (the chained job's loss after a task manager and a broker SIGKILL, issue
// 41; docs/internals/recovery.md):
//   - (A) an open marker covers it: set aside, waiting for that marker;
//   - (B) a committed marker, or the ack-log's watermark, covers it: it was
//     acknowledged as processed, so the output of that marker's checkpoint
//     is what went missing;
//   - (C) below the share start offset, and nothing covers it: the group
//     skipped or archived it, unprocessed;
//   - at or above the share start offset, nothing covers it: not
//     acknowledged, never delivered or still held.
func explain(ctx context.Context, seeds []string, group string, recs []*kgo.Record, opts ...kgo.Opt) ([]string, error) {
	out := make([]string, len(recs))
	ix, err := acklog.NewIndex(ctx, seeds, acklog.TopicFor(group), opts...)
	if err != nil {
		return out, fmt.Errorf("ack-log of %s: %w", group, err)
	}
	defer ix.Close()
	if err := ix.CatchUpToEnd(ctx); err != nil {
		return out, fmt.Errorf("ack-log of %s: %w", group, err)
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...)}, opts...)...)
	if err != nil {
		return out, err
	}
	defer cl.Close()
	d, err := kadm.NewClient(cl).DescribeShareGroupOffsets(ctx, group)
	if err != nil {
		return out, fmt.Errorf("share start offsets of %s: %w", group, err)
	}
	for k, r := range recs {
		tp := acklog.TopicPartition{Topic: r.Topic, Partition: r.Partition}
		start, known := int64(-1), false
		if o, ok := d[group].Offsets[r.Topic][r.Partition]; ok && o.Err == nil {
			start, known = o.StartOffset, true
		}
		e, covered := ix.Lookup(tp, r.Offset)
		switch {
		case covered && e.Offset < 0:
			out[k] = fmt.Sprintf("(B) below the ack-log watermark of %s: acknowledged as processed", tp)
		case covered && e.Status == acklog.Committed:
			out[k] = fmt.Sprintf("(B) committed marker at ack-log %d covers it (checkpoint %d, member %s, transaction %s): acknowledged as processed",
				e.Offset, e.Marker.Checkpoint, e.Marker.Member, e.Marker.TransactionalID)
		case covered:
			out[k] = fmt.Sprintf("(A) %s marker at ack-log %d covers it (checkpoint %d, member %s, transaction %s): set aside",
				e.Status, e.Offset, e.Marker.Checkpoint, e.Marker.Member, e.Marker.TransactionalID)
		case !known:
			out[k] = "no share start offset for its partition, no marker covers it"
		case r.Offset < start:
			out[k] = fmt.Sprintf("(C) below the share start offset %d and no marker covers it: skipped or archived by the group", start)
		default:
			out[k] = fmt.Sprintf("at or above the share start offset %d, no marker covers it: not acknowledged", start)
		}
	}
	return out, nil
}
