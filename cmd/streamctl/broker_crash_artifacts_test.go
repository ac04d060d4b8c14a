package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/weirstream/weir/internal/kafkatxn"
)

// crashArtifacts writes, when WEIR_BROKER_CRASH_ARTIFACTS names a directory
// and the run failed, what a failure needs to be explained: the job log,
// every broker run's stderr, and the output topic as it is in the log
// (read_uncommitted, markers included, with producer ids, epochs and
// headers), in DIR/<test name>/.
func crashArtifacts(t *testing.T, b *crashingBroker, jobLog string) {
	dir := os.Getenv("WEIR_BROKER_CRASH_ARTIFACTS")
	if dir == "" || !t.Failed() {
		return
	}
	dir = filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("artifacts: %v", err)
		return
	}
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Logf("artifacts: %v", err)
		}
	}
	write("job.log", jobLog)
	write("broker.log", b.stderr())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	write("transactions.txt", describeTxns(ctx, b.addr))
	if out, err := exec.CommandContext(ctx, "cp", "-a", b.dir, filepath.Join(dir, "data")).CombinedOutput(); err != nil {
		t.Logf("artifacts: copy data dir: %v: %s", err, out)
	}
	for _, topic := range []string{"counts", "counts-kafka", "lines"} {
		s, err := dumpTopic(ctx, b.addr, topic)
		if err != nil {
			s += fmt.Sprintf("\nerror: %v\n", err)
		}
		write(topic+".dump", s)
	}
	t.Logf("artifacts in %s", dir)
}

// dumpTopic returns every record of topic, read_uncommitted with control
// records, a line each: partition, offset, producer id/epoch, and the key,
// value and headers, or the marker's type and coordinator epoch.
func dumpTopic(ctx context.Context, addr, topic string) (string, error) {
	var out strings.Builder
	err := eachRecord(ctx, addr, topic, func(r *kgo.Record) {
		if r.Attrs.IsControl() {
			var k kmsg.ControlRecordKey
			var v kmsg.EndTxnMarker
			_ = k.ReadFrom(r.Key)
			_ = v.ReadFrom(r.Value)
			typ := "ABORT"
			if k.Type == kmsg.ControlRecordKeyTypeCommit {
				typ = "COMMIT"
			}
			fmt.Fprintf(&out, "p%d @%d pid=%d/%d %s coord=%d ts=%s\n", r.Partition, r.Offset, r.ProducerID, r.ProducerEpoch, typ, v.CoordinatorEpoch, r.Timestamp.Format("15:04:05.000"))
			return
		}
		fmt.Fprintf(&out, "p%d @%d pid=%d/%d txn=%v ts=%s %s=%s", r.Partition, r.Offset, r.ProducerID, r.ProducerEpoch, r.Attrs.IsTransactional(), r.Timestamp.Format("15:04:05.000"), r.Key, r.Value)
		for _, h := range r.Headers {
			fmt.Fprintf(&out, " [%s=%s]", h.Key, h.Value)
		}
		out.WriteByte('\n')
	})
	return out.String(), err
}

// describeTxns lists every transactional id the broker knows with its
// state, producer id, epoch and partitions, and each topic's end and last
// stable offsets.
func describeTxns(ctx context.Context, addr string) string {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return err.Error()
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var out strings.Builder
	listed, err := adm.ListTransactions(ctx, nil, nil)
	if err != nil {
		fmt.Fprintf(&out, "list transactions: %v\n", err)
	}
	described, err := adm.DescribeTransactions(ctx, listed.TransactionalIDs()...)
	if err != nil {
		fmt.Fprintf(&out, "describe transactions: %v\n", err)
	}
	for _, d := range described.Sorted() {
		fmt.Fprintf(&out, "%s state=%s pid=%d/%d started=%d topics=%v err=%v\n", d.TxnID, d.State, d.ProducerID, d.ProducerEpoch, d.StartTimestamp, d.Topics, d.Err)
	}
	for _, topic := range []string{"counts", "__weir-acklog-wc"} {
		ends, _ := adm.ListEndOffsets(ctx, topic)
		lsos, _ := adm.ListCommittedOffsets(ctx, topic)
		ends.Each(func(o kadm.ListedOffset) {
			l, _ := lsos.Lookup(topic, o.Partition)
			fmt.Fprintf(&out, "%s/%d end=%d lso=%d\n", topic, o.Partition, o.Offset, l.Offset)
		})
	}
	if dp, err := adm.DescribeProducers(ctx, kadm.TopicsSet{}); err == nil {
		for _, p := range dp.SortedProducers() {
			fmt.Fprintf(&out, "producer %s/%d pid=%d/%d txn_start=%d last_seq=%d\n", p.Topic, p.Partition, p.ProducerID, p.ProducerEpoch, p.CurrentTxnStartOffset, p.LastSequence)
		}
	}
	return out.String()
}

// lostTxnCommits reads topic read_uncommitted, markers included, and
// returns the transactions (producer id and epoch) that end with the
// embedded broker's lost-state abort marker on one partition and with a
// commit marker on another, or on the same one later:
//   - continued: the commit marker was written after the lost-state one. A
//     transaction the broker lost whose producer went on with it and
//     committed part of it (the broker writes lost-state markers while it
//     repairs, before it lets clients in, so such a commit comes later).
//   - torn: the commit marker was written before it. The broker was killed
//     in the middle of the EndTxn that committed the transaction, with the
//     marker on some partitions only; the repair aborted the rest as lost,
//     and kafkatxn's recovery copies exactly their records.
func lostTxnCommits(ctx context.Context, addr, topic string) (continued, torn []string, err error) {
	type txn struct {
		pid   int64
		epoch int16
	}
	type marker struct {
		at string
		ts time.Time
	}
	lost, commits := map[txn]marker{}, map[txn][]marker{}
	err = eachRecord(ctx, addr, topic, func(r *kgo.Record) {
		if !r.Attrs.IsControl() {
			return
		}
		var k kmsg.ControlRecordKey
		var v kmsg.EndTxnMarker
		if k.ReadFrom(r.Key) != nil || v.ReadFrom(r.Value) != nil {
			return
		}
		m := marker{fmt.Sprintf("%s/%d@%d", r.Topic, r.Partition, r.Offset), r.Timestamp}
		switch x := (txn{r.ProducerID, r.ProducerEpoch}); {
		case k.Type == kmsg.ControlRecordKeyTypeCommit:
			commits[x] = append(commits[x], m)
		case v.CoordinatorEpoch == kafkatxn.LostStateCoordinatorEpoch:
			if l, ok := lost[x]; !ok || m.ts.Before(l.ts) {
				lost[x] = m
			}
		}
	})
	for x, l := range lost {
		for _, c := range commits[x] {
			s := fmt.Sprintf("producer %d epoch %d: lost-state abort at %s (%s), commit at %s (%s)",
				x.pid, x.epoch, l.at, l.ts.Format("15:04:05.000"), c.at, c.ts.Format("15:04:05.000"))
			if c.ts.Before(l.ts) {
				torn = append(torn, s)
			} else {
				continued = append(continued, s)
			}
		}
	}
	return continued, torn, err
}

// eachRecord calls fn on every record of topic, read_uncommitted with
// control records, partition by partition in offset order per partition.
func eachRecord(ctx context.Context, addr, topic string, fn func(*kgo.Record)) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return err
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		return err
	}
	remaining := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil && o.Offset > 0 {
			remaining[o.Partition] = o.Offset
		}
	})
	cons, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()), kgo.KeepControlRecords())
	if err != nil {
		return err
	}
	defer cons.Close()
	for len(remaining) > 0 {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		fs.EachRecord(func(r *kgo.Record) {
			fn(r)
			if end, ok := remaining[r.Partition]; ok && r.Offset+1 >= end {
				delete(remaining, r.Partition)
			}
		})
	}
	return nil
}
