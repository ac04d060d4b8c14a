package sharegroup

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/broker/brokerproc"
	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sources/sharegroup/acklog"
)

// TestATornRequeueCommitIsRepairedAfterABrokerCrash: a re-queue transaction
// spans the retry topic (the copies) and the ack-log (the marker covering
// the originals), and it is in no checkpoint. The embedded broker (a
// process) is SIGKILLed in the middle of the EndTxn that commits it: kfake
// writes commit markers partition by partition, so one side got its commit
// marker and the restart's repair ends the other with a lost-state abort.
// Unrepaired, a committed copy without its marker is processed next to its
// original (a duplicate), and a committed marker without its copy makes the
// returning original count as done (a loss). Every record must be emitted
// once, and covered by exactly one committed marker.
func TestATornRequeueCommitIsRepairedAfterABrokerCrash(t *testing.T) {
	configs := []string{"group.share.delivery.count.limit=5", "group.share.record.lock.duration.ms=3000",
		"share.record.lock.sweep.interval.ms=100"}
	cases := []struct {
		name      string
		committed string // the topic whose partition got the commit marker before the kill
	}{
		{"the retry copies committed, the ack-log marker lost", "g-retry"},
		{"the ack-log marker committed, the retry copies lost", acklog.TopicFor("g")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			const n = 10
			dir := t.TempDir()
			p := brokerproc.Start(t, dir, "127.0.0.1:0", configs...)
			env := &kafkatest.Env{Addr: p.Addr}
			env.CreateTopic(t, "in", 1, nil)
			produceN(t, env, "in", n)
			// Attempts 1 and 2 fail before their checkpoint: the third
			// delivery is the last healthy one (limit 5, restartBurn 2),
			// and attempt 3 re-queues the records.
			for range 2 {
				s := openSource(t, env, 0, nil)
				pollFor(t, s, n, 10*time.Second)
				s.Close()
			}
			var torn atomic.Bool
			s := testSources(t, env)().(*Source[string])
			s.rq.beforeCommit = func(h checkpoint.TxnHandle) {
				if torn.Swap(true) {
					return
				}
				commitOn(t, env, h, tc.committed)
				p.Kill(t)
				p = brokerproc.Start(t, dir, p.Addr, configs...)
			}
			t.Cleanup(func() { s.Close() })
			oc := &runtime.OperatorContext{Job: "job", Name: "src", UID: "src", Subtask: 0, Parallelism: 2, Attempt: 3, Logger: testLogger(t)}
			if err := s.Open(t.Context(), oc); err != nil {
				t.Fatal(err)
			}
			c := &sliceCollector{}
			for deadline := time.Now().Add(30 * time.Second); !torn.Load(); {
				if time.Now().After(deadline) {
					t.Fatal("attempt 3 never re-queued the records")
				}
				if err := s.Poll(t.Context(), c); err != nil {
					t.Logf("attempt 3 failed (the job restarts): %v", err)
					break
				}
			}
			if len(c.vals) != 0 {
				t.Fatalf("attempt 3 emitted %v at the records' last healthy delivery, want them re-queued", c.vals)
			}
			s.Close() // the attempt ends without a checkpoint
			vals := drainOneLane(t, env, openSource(t, env, 0, nil), n)
			checkEveryRecordOnce(t, env, vals, n, "after the torn re-queue commit")
		})
	}
}

// commitOn writes the commit marker of h's transaction on its partitions of
// topic, as the EndTxn kfake was running when killed had.
func commitOn(t *testing.T, env *kafkatest.Env, h checkpoint.TxnHandle, topic string) {
	t.Helper()
	m := kmsg.NewWriteTxnMarkersRequestMarker()
	m.ProducerID, m.ProducerEpoch, m.Committed = h.ProducerID, h.Epoch, true
	mt := kmsg.NewWriteTxnMarkersRequestMarkerTopic()
	mt.Topic = topic
	for _, p := range h.Partitions {
		if p.Topic == topic {
			mt.Partitions = append(mt.Partitions, p.Partition)
		}
	}
	if len(mt.Partitions) == 0 || len(mt.Partitions) == len(h.Partitions) {
		t.Fatalf("re-queue transaction on %v: want partitions of %s and of another topic", h.Partitions, topic)
	}
	m.Topics = append(m.Topics, mt)
	req := kmsg.NewPtrWriteTxnMarkersRequest()
	req.Markers = append(req.Markers, m)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, env.Client(t, kgo.DisableClientMetrics()))
	if err != nil {
		t.Fatal(err)
	}
	for _, rm := range resp.Markers {
		for _, rt := range rm.Topics {
			for _, rp := range rt.Partitions {
				if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
					t.Fatalf("commit marker on %s/%d: %v", rt.Topic, rp.Partition, err)
				}
			}
		}
	}
}
