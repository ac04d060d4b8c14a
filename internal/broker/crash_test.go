package broker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/weirstream/weir/internal/broker/brokerproc"
	"github.com/weirstream/weir/internal/kafkatest"
)

// crashed starts a broker process on a fresh dir, runs before against it,
// SIGKILLs it and starts a new broker process on the same dir and address.
func crashed(t *testing.T, before func(addr string), configs ...string) *brokerproc.Proc {
	t.Helper()
	return crashedOn(t, t.TempDir(), before, configs...)
}

func crashedOn(t *testing.T, dir string, before func(addr string), configs ...string) *brokerproc.Proc {
	t.Helper()
	p := brokerproc.Start(t, dir, "127.0.0.1:0", configs...)
	before(p.Addr)
	p.Kill(t)
	return brokerproc.Start(t, dir, p.Addr, configs...)
}

func TestAutoCreatedTopicSurvivesACrash(t *testing.T) {
	ctx := ctxT(t)
	p := crashed(t, func(addr string) {
		cl := client(t, addr, kgo.AllowAutoTopicCreation(), kgo.DefaultProduceTopic("auto"))
		for i := range 10 {
			if err := cl.ProduceSync(ctx, kgo.StringRecord(fmt.Sprint(i))).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	})
	recs, err := kafkatest.ReadCommitted(ctx, []string{p.Addr}, "auto")
	if err != nil {
		t.Fatalf("auto-created topic after a crash: %v", err)
	}
	if got := valuesOf(recs); got != "0,1,2,3,4,5,6,7,8,9" {
		t.Fatalf("auto-created topic after a crash holds %q, want 0..9", got)
	}
}

func TestGroupConfigsSurviveACrash(t *testing.T) {
	ctx := ctxT(t)
	p := crashed(t, func(addr string) {
		alter := kmsg.NewPtrIncrementalAlterConfigsRequest()
		res := kmsg.NewIncrementalAlterConfigsRequestResource()
		res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
		res.ResourceName = "g"
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name, c.Value, c.Op = "share.auto.offset.reset", kmsg.StringPtr("earliest"), kmsg.IncrementalAlterConfigOpSet
		res.Configs = append(res.Configs, c)
		alter.Resources = append(alter.Resources, res)
		resp, err := alter.RequestWith(ctx, client(t, addr))
		if err != nil {
			t.Fatal(err)
		}
		if err := kerr.ErrorForCode(resp.Resources[0].ErrorCode); err != nil {
			t.Fatal(err)
		}
	})
	if got := groupConfig(t, p.Addr, "g", "share.auto.offset.reset"); got != "earliest" {
		t.Fatalf("after a crash share.auto.offset.reset of group g = %q, want earliest", got)
	}
}

func groupConfig(t *testing.T, addr, group, key string) string {
	t.Helper()
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	res.ConfigNames = []string{key}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctxT(t), client(t, addr))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range resp.Resources {
		for _, c := range r.Configs {
			if c.Name == key && c.Value != nil {
				return *c.Value
			}
		}
	}
	return ""
}

// shareConsumer returns a share consumer of group on topic that fetches only
// when polled.
func shareConsumer(t *testing.T, addr, group, topic string) *kgo.Client {
	return client(t, addr, kgo.ShareGroup(group), kgo.ConsumeTopics(topic),
		kgo.ShareMaxRecords(1000), kgo.ShareMaxRecordsStrict())
}

func setGroupConfig(t *testing.T, addr, group, key, value string) {
	t.Helper()
	alter := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Value, c.Op = key, kmsg.StringPtr(value), kmsg.IncrementalAlterConfigOpSet
	res.Configs = append(res.Configs, c)
	alter.Resources = append(alter.Resources, res)
	resp, err := alter.RequestWith(ctxT(t), client(t, addr))
	if err != nil {
		t.Fatal(err)
	}
	if err := kerr.ErrorForCode(resp.Resources[0].ErrorCode); err != nil {
		t.Fatal(err)
	}
}

// crashedClient dials until crash is called, then never again: a client
// that went down with the broker it was connected to.
type crashedClient struct{ down atomic.Bool }

func (c *crashedClient) crash() { c.down.Store(true) }

func (c *crashedClient) dial(ctx context.Context, network, host string) (net.Conn, error) {
	if c.down.Load() {
		return nil, errors.New("this client crashed")
	}
	var d net.Dialer
	return d.DialContext(ctx, network, host)
}

type offsetKey struct {
	p int32
	o int64
}

// TestShareGroupRedeliversEveryUnacknowledgedRecordAfterACrash: records a
// share group never acknowledged must come back after a crash, and records
// it had acknowledged may come back only as redeliveries (delivery count
// > 1), which is what the source's ack-log lookup keys on.
func TestShareGroupRedeliversEveryUnacknowledgedRecordAfterACrash(t *testing.T) {
	ctx := ctxT(t)
	accepted := map[offsetKey]bool{}
	all := map[offsetKey]bool{}
	const n = 200
	var journaled map[int32]int64
	dir := t.TempDir()
	var gone crashedClient
	p := crashedOn(t, dir, func(addr string) {
		defer gone.crash()
		if _, err := kadm.NewClient(client(t, addr)).CreateTopic(ctx, 2, 1, nil, "in"); err != nil {
			t.Fatal(err)
		}
		prod := client(t, addr, kgo.DefaultProduceTopic("in"))
		for i := range n {
			r := prod.ProduceSync(ctx, kgo.StringRecord(fmt.Sprint(i)))
			if err := r.FirstErr(); err != nil {
				t.Fatal(err)
			}
			all[offsetKey{r[0].Record.Partition, r[0].Record.Offset}] = true
		}
		setGroupConfig(t, addr, "g", "share.auto.offset.reset", "earliest")
		// The consumer crashes with the broker: it must not reconnect to
		// the restarted one (same address) and stay a live member that
		// holds a partition, and the records it acquired, for the rest of
		// the test.
		cons := client(t, addr, kgo.ShareGroup("g"), kgo.ConsumeTopics("in"),
			kgo.ShareMaxRecords(40), kgo.ShareMaxRecordsStrict(), kgo.Dialer(gone.dial))
		for len(accepted) < n/2 {
			fs := cons.PollRecords(ctx, 40)
			if err := fs.Err0(); err != nil {
				t.Fatal(err)
			}
			for _, r := range fs.Records() {
				r.Ack(kgo.AckAccept)
				accepted[offsetKey{r.Partition, r.Offset}] = true
			}
			if err := cons.FlushAcks(ctx); err != nil {
				t.Fatal(err)
			}
		}
		// Hold one more batch, acquired and unacknowledged, at the crash.
		cons.PollRecords(ctx, 40)
		journaled = waitJournaled(t, dir, addr, "g", "in")
	})

	cons := client(t, p.Addr, kgo.ShareGroup("g"), kgo.ConsumeTopics("in"),
		kgo.ShareMaxRecords(1000), kgo.ShareMaxRecordsStrict())
	seen := map[offsetKey]bool{}
	missing := func() int {
		m := 0
		for k := range all {
			if !accepted[k] && !seen[k] {
				m++
			}
		}
		return m
	}
	// The crashed consumer is restored as a member (kfake keeps share
	// group members, as Kafka's coordinator does) and holds its partition
	// until its session times out (10 s here): wait past that.
	pollCtx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	for missing() > 0 && pollCtx.Err() == nil {
		fs := cons.PollRecords(pollCtx, 1000)
		for _, r := range fs.Records() {
			k := offsetKey{r.Partition, r.Offset}
			// Any record after the journaled start offset may have been
			// processed before the crash (acquired, its output committed,
			// its ACCEPT lost): it must come back as a redelivery, which
			// the source looks up in its ack-log before processing.
			if r.Offset < journaled[r.Partition] {
				t.Errorf("record %d/%d redelivered after the crash, below the journaled start offset %d: "+
					"the share state went back further than the journal", k.p, k.o, journaled[r.Partition])
			}
			if r.DeliveryCount() < 2 {
				t.Errorf("record %d/%d (accepted before the crash: %v) delivered after the crash with delivery count %d, want > 1",
					k.p, k.o, accepted[k], r.DeliveryCount())
			}
			seen[k] = true
		}
	}
	again := 0
	for k := range seen {
		if accepted[k] {
			again++
		}
	}
	t.Logf("accepted before the crash: %d; after: %d records delivered, %d of them accepted before (redelivered for the ack-log lookup)",
		len(accepted), len(seen), again)
	if !strings.Contains(p.Stderr(), "did not stop cleanly") {
		t.Errorf("the restarted broker did not log the unclean stop; stderr:\n%s", p.Stderr())
	}
	if m := missing(); m > 0 {
		t.Fatalf("after a crash, %d of %d unacknowledged records were never redelivered (accepted before: %d, seen after: %d)",
			m, n-len(accepted), len(accepted), len(seen))
	}
}

// waitJournaled waits until the broker's journal in dir (README: "After a
// crash") holds the share start offsets the broker reports for group's
// topic, and returns them.
func waitJournaled(t *testing.T, dir, addr, group, topic string) map[int32]int64 {
	t.Helper()
	ctx := ctxT(t)
	adm := kadm.NewClient(client(t, addr))
	for {
		d, err := adm.DescribeShareGroupOffsets(ctx, group)
		if err != nil {
			t.Fatal(err)
		}
		want := map[int32]int64{}
		for p, o := range d[group].Offsets[topic] {
			want[p] = o.StartOffset
		}
		var j struct {
			ShareStart map[string]map[string]map[int32]int64 `json:"share_start"`
		}
		if raw, err := os.ReadFile(filepath.Join(dir, "weir-broker-journal.json")); err == nil {
			_ = json.Unmarshal(raw, &j)
		}
		if len(want) > 0 && maps.Equal(j.ShareStart[group][topic], want) {
			return want
		}
		select {
		case <-ctx.Done():
			t.Fatalf("journal never caught up with share start offsets %v (journal: %v)", want, j.ShareStart)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestShareGroupStillReadsCommittedAfterACrash: a share group set to
// share.isolation.level=read_committed (as Weir's source and session set
// it) keeps it across a SIGKILL of the broker, which loses kfake's group
// configs: the repair re-applies it before clients are let in, so the group
// is handed exactly what a read_committed reader sees, neither the aborted
// transaction nor the one the crash left open.
func TestShareGroupStillReadsCommittedAfterACrash(t *testing.T) {
	ctx := ctxT(t)
	p := crashed(t, func(addr string) {
		if _, err := kadm.NewClient(client(t, addr)).CreateTopic(ctx, 1, 1, nil, "t"); err != nil {
			t.Fatal(err)
		}
		setGroupConfig(t, addr, "g", "share.isolation.level", "read_committed")
		setGroupConfig(t, addr, "g", "share.auto.offset.reset", "earliest")
		committer := txnClient(t, addr, "committer", time.Minute)
		inTxn(ctx, t, committer, true, "c0", "c1", "c2", "c3", "c4")
		aborter := txnClient(t, addr, "aborter", time.Minute)
		inTxn(ctx, t, aborter, false, "a0", "a1", "a2", "a3", "a4")
		if err := aborter.EndTransaction(ctx, kgo.TryAbort); err != nil {
			t.Fatal(err)
		}
		inTxn(ctx, t, txnClient(t, addr, "open", time.Minute), false, "o0", "o1", "o2", "o3", "o4") // left open
		inTxn(ctx, t, committer, true, "c5", "c6", "c7", "c8", "c9")
	})
	if got := groupConfig(t, p.Addr, "g", "share.isolation.level"); got != "read_committed" {
		t.Fatalf("after a crash share.isolation.level of group g = %q, want read_committed", got)
	}
	committed, err := kafkatest.ReadCommitted(ctx, []string{p.Addr}, "t")
	if err != nil {
		t.Fatal(err)
	}
	want := valuesOf(committed)
	if strings.Contains(want, "a") || strings.Contains(want, "o") || len(committed) < 5 {
		t.Fatalf("read_committed after the crash: %s", want)
	}
	cons := shareConsumer(t, p.Addr, "g", "t")
	var got []*kgo.Record
	for len(got) < len(committed) {
		fs := cons.PollRecords(ctx, 1000)
		if err := ctx.Err(); err != nil {
			t.Fatalf("share group g got %s, want %s", valuesOf(got), want)
		}
		got = append(got, fs.Records()...)
	}
	if valuesOf(got) != want {
		t.Fatalf("share group g got %s after the crash, want what read_committed sees: %s", valuesOf(got), want)
	}
}
