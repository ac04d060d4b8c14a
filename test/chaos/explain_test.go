package chaos

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/sources/sharegroup"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// TestExplainNamesWhatTheGroupAndTheAckLogSayOfEachMissingRecord: a failed
// round's dump says, for each input record whose effect is missing, which
// explanation of a loss it fits: covered by an open marker (A), by a
// committed marker or the ack-log's watermark (B), skipped below the share
// start offset with nothing covering it (C), or not acknowledged at all.
func TestExplainNamesWhatTheGroupAndTheAckLogSayOfEachMissingRecord(t *testing.T) {
	ctx := t.Context()
	env := kafkatest.New(t)
	env.CreateTopic(t, "up", 1, nil)
	prod := env.Client(t, kgo.DefaultProduceTopic("up"))
	var recs []*kgo.Record
	for i := range 40 {
		recs = append(recs, kgo.StringRecord(kafkatest.InputLine(i)))
	}
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	admin := env.Client(t)
	if err := acklog.EnsureTopic(ctx, kadm.NewClient(admin), acklog.TopicFor("g")); err != nil {
		t.Fatal(err)
	}
	if err := sharegroup.SetGroupConfig(ctx, admin, "g", "share.auto.offset.reset", "earliest"); err != nil {
		t.Fatal(err)
	}
	// The group acknowledges offsets 0-19: its share start offset is 20.
	cons := env.Client(t, kgo.ShareGroup("g"), kgo.ConsumeTopics("up"), kgo.ShareMaxRecords(10), kgo.ShareMaxRecordsStrict())
	for start := int64(0); start < 20; {
		fs := cons.PollRecords(ctx, 10)
		if err := ctx.Err(); err != nil {
			t.Fatal(err)
		}
		for _, r := range fs.Records() {
			if r.Offset < 20 {
				r.Ack(kgo.AckAccept)
			} else {
				r.Ack(kgo.AckRelease)
			}
		}
		if err := cons.FlushAcks(ctx); err != nil {
			t.Fatal(err)
		}
		d, err := kadm.NewClient(admin).DescribeShareGroupOffsets(ctx, "g")
		if err != nil {
			t.Fatal(err)
		}
		start = d["g"].Offsets["up"][0].StartOffset
	}
	cons.Close()

	topic := acklog.TopicFor("g")
	tp := acklog.TopicPartition{Topic: "up", Partition: 0}
	marker := func(txn string, cp uint64, from, to int64) *kgo.Record {
		return acklog.Marker{Group: "g", Member: "count#0", Checkpoint: cp, TransactionalID: txn,
			Ranges: map[acklog.TopicPartition][]acklog.Range{tp: {{Start: from, End: to}}}, CreatedAt: time.Now()}.Record(topic)
	}
	if err := admin.ProduceSync(ctx, acklog.Watermark{Group: "g", TP: tp, Offset: 3}.Record(topic)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	env.WriteTxn(t, "src-0", true, marker("src-0", 4, 5, 10))
	env.WriteTxn(t, "src-1", true, marker("src-1", 9, 30, 32))
	end := env.OpenTxn(t, "src-2", marker("src-2", 10, 25, 30))
	defer end(false)

	byOffset := map[int64]string{1: "(B) below the ack-log watermark", 6: "(B) committed marker", 15: "(C) below the share start offset 20",
		26: "(A) open marker", 31: "(B) committed marker", 35: "at or above the share start offset 20"}
	var asked []*kgo.Record
	var want []string
	for _, off := range []int64{1, 6, 15, 26, 31, 35} {
		asked = append(asked, &kgo.Record{Topic: "up", Partition: 0, Offset: off})
		want = append(want, byOffset[off])
	}
	ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	got, err := explain(ectx, []string{env.Addr}, "g", asked)
	if err != nil {
		t.Fatal(err)
	}
	for k := range asked {
		if !strings.HasPrefix(got[k], want[k]) {
			t.Errorf("offset %d: %q, want it to start with %q", asked[k].Offset, got[k], want[k])
		}
	}
}
