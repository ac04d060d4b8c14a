package kafka

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/internal/kafkatest"
	"github.com/weirstream/weir/runtime"
	ksink "github.com/weirstream/weir/sinks/kafka"
)

// produce writes n records "<prefix><i>" to topic, record i to partition
// i mod partitions, each stamped ts(i) (epoch ms; nil: now).
func produce(t *testing.T, env *kafkatest.Env, topic string, partitions, from, n int, prefix string, ts func(i int) int64) {
	t.Helper()
	cl := env.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	recs := make([]*kgo.Record, 0, n)
	for i := from; i < from+n; i++ {
		r := &kgo.Record{Topic: topic, Partition: int32(i % partitions), Value: []byte(prefix + strconv.Itoa(i))}
		if ts != nil {
			r.Timestamp = time.UnixMilli(ts(i))
		}
		recs = append(recs, r)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// produceB is produce for a benchmark.
func produceB(b *testing.B, env *kafkatest.Env, topic string, partitions, from, n int) {
	b.Helper()
	cl := env.Client(b, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	recs := make([]*kgo.Record, 0, n)
	for i := from; i < from+n; i++ {
		recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(i % partitions), Value: []byte("r" + strconv.Itoa(i))})
	}
	if err := cl.ProduceSync(b.Context(), recs...).FirstErr(); err != nil {
		b.Fatalf("produce: %v", err)
	}
}

// names returns "<prefix><i>" for i in [from, from+n).
func names(prefix string, from, n int) []string {
	out := make([]string, 0, n)
	for i := from; i < from+n; i++ {
		out = append(out, prefix+strconv.Itoa(i))
	}
	return out
}

// decodeString is the decode of the tests: the value as a string.
func decodeString(r *kgo.Record) (string, error) { return string(r.Value), nil }

// copyJob is a job reading in with this source (opts after the broker,
// topic and group) and writing each value to out, exactly once.
func copyJob(t *testing.T, env *kafkatest.Env, name, in, out string, par int, opts ...Opt) *runtime.Job {
	t.Helper()
	src, err := New(decodeString, append([]Opt{Brokers(env.Addr), Topics(in), Group(name), DiscoveryInterval(200 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	sink, err := ksink.NewSink(func(v string) (*kgo.Record, error) {
		return &kgo.Record{Topic: out, Value: []byte(v)}, nil
	}, []ksink.Opt{ksink.Brokers(env.Addr)})
	if err != nil {
		t.Fatal(err)
	}
	j := runtime.NewJob(name, runtime.DefaultParallelism(par))
	s := runtime.FromSource(j, "source", src, runtime.UID("source"))
	runtime.SinkTo(s, "sink", sink, runtime.UID("sink"))
	return j
}

// values reads topic read_committed and returns its values.
func values(t *testing.T, env *kafkatest.Env, topic string) []string {
	t.Helper()
	var out []string
	for _, r := range env.ReadCommitted(t, topic) {
		out = append(out, string(r.Value))
	}
	return out
}

// sameSet fails unless got holds every element of want exactly once.
func sameSet(t *testing.T, got, want []string) {
	t.Helper()
	g, w := slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))
	if slices.Equal(g, w) {
		return
	}
	count := map[string]int{}
	for _, v := range got {
		count[v]++
	}
	var dup, lost []string
	for _, v := range want {
		switch count[v] {
		case 0:
			lost = append(lost, v)
		case 1:
		default:
			dup = append(dup, v)
		}
		delete(count, v)
	}
	extra := len(count)
	t.Fatalf("output: %d records, want %d: %d lost (e.g. %v), %d duplicated (e.g. %v), %d unexpected",
		len(got), len(want), len(lost), head(lost), len(dup), head(dup), extra)
}

func head(s []string) []string { return s[:min(len(s), 5)] }

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
	}
}
