package wordcount

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/examples/input"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sinks/kafka"
	"github.com/weirstream/weir/sources/sharegroup"
)

// Name is the job type's registered name.
const Name = "wordcount"

// Type is the wordcount job type (docs/architecture.md, "The wordcount contract").
var Type = runtime.JobType{
	Name:        Name,
	Description: "exactly-once wordcount: input topic (share group or partitions) -> words -> running count per word -> output",
	Params: append([]runtime.ParamSpec{
		sharegroup.BrokersParam(),
		{Name: "input", Default: "lines", Description: "input topic"},
		{Name: "output", Default: "counts", Description: "output topic, created when missing"},
		{Name: "group", Default: "wordcount", Description: "share group (source=sharegroup), or consumer group the offsets are committed to for monitoring (source=kafka)"},
		{Name: "guarantee", Default: "exactly-once", Description: "exactly-once | at-least-once"},
		{Name: "min-length", Default: "0", Description: "count only words of at least this many bytes; above 0 the job has an operator more (UID filter)"},
	}, input.Params()...),
	Build: Build,
	Check: input.Check,
}

// Register adds the wordcount job type to r.
func Register(r *runtime.Registry) error { return r.Register(Type) }

// Words splits a line as the contract says.
func Words(line string) []string { return strings.Fields(strings.ToLower(line)) }

// Count is a word and its running count.
type Count struct {
	Word  string
	Count int64
}

// Build builds the wordcount graph from its parameters.
func Build(p runtime.Params) (*runtime.Job, error) { return BuildWith(p) }

// BuildWith is Build with extra options for the share-group source (e.g.
// sharegroup.ObserveInFlight for metrics); they are unused with
// source=kafka.
func BuildWith(p runtime.Params, srcOpts ...sharegroup.Opt) (*runtime.Job, error) {
	guarantee, err := p.OneOf("guarantee", "exactly-once", "at-least-once")
	if err != nil {
		return nil, err
	}
	minLength := 0
	if p.String("min-length") != "" {
		if minLength, err = p.Int("min-length"); err != nil {
			return nil, err
		}
	}
	brokers := sharegroup.ParamBrokers(p)
	sinkG := kafka.ExactlyOnce
	if guarantee == "at-least-once" {
		sinkG = kafka.AtLeastOnce
	}
	src, err := input.New(p, func(r *kgo.Record) (string, error) { return string(r.Value), nil }, input.Config{
		Brokers: brokers, Topic: p.String("input"), Group: p.String("group"),
		AtLeastOnce: guarantee == "at-least-once", ShareGroupOpts: srcOpts})
	if err != nil {
		return nil, err
	}
	output := p.String("output")
	sink, err := kafka.NewSink(func(c Count) (*kgo.Record, error) { return CountRecord(output, c), nil }, []kafka.Opt{kafka.Brokers(brokers...), kafka.Guarantee(sinkG)})
	if err != nil {
		return nil, err
	}

	jopts, err := p.JobOpts()
	if err != nil {
		return nil, err
	}
	j := runtime.NewJob(Name, jopts...)
	lines := runtime.FromSource(j, "lines", src)
	words := runtime.FlatMap(lines, "split", func(line string, out runtime.Collector[string]) error {
		for _, w := range Words(line) {
			out.Collect(w)
		}
		return nil
	})
	if minLength > 0 {
		// An operator of its own (UID filter): a job upgraded from a
		// savepoint taken without it starts it empty.
		words = runtime.Filter(words, "filter", func(w string) bool { return len(w) >= minLength })
	}
	byWord := runtime.KeyBy(words, func(w string) string { return w }, nil)
	counts := runtime.Process(byWord, "count", NewCounter)
	runtime.SinkTo(counts, "counts", WithTopic(brokers, output, sink))
	return j, nil
}

// NewCounter returns the keyed process function that keeps each word's
// running count in keyed state and emits it for every occurrence.
func NewCounter() runtime.KeyedProcessFunction[string, string, Count] { return &counter{} }

type counter struct {
	n *runtime.ValueState[int64]
}

func (c *counter) Open(_ context.Context, st *runtime.StateRegistry[string]) (err error) {
	c.n, err = runtime.NewValueState[int64](st, "count", nil)
	return err
}

func (c *counter) Process(word string, _ string, out runtime.Collector[Count]) error {
	n, _ := c.n.Value()
	n++
	c.n.Update(n)
	out.Collect(Count{Word: word, Count: n})
	return nil
}

// CountRecord is the output record of c on topic: key the word, value the
// count in decimal. The record, its key and its value are one allocation
// for words of up to 44 bytes (kgo keeps the record until its promise
// fires, so records are not pooled).
func CountRecord(topic string, c Count) *kgo.Record {
	rb := &countRecord{}
	buf := rb.buf[:0]
	if len(c.Word)+20 > len(rb.buf) {
		buf = make([]byte, 0, len(c.Word)+20) // 20: the longest int64
	}
	buf = append(buf, c.Word...)
	n := len(buf)
	buf = strconv.AppendInt(buf, c.Count, 10)
	rb.r = kgo.Record{Topic: topic, Key: buf[:n:n], Value: buf[n:]}
	return &rb.r
}

// countRecord holds a record and the bytes of its key and value.
type countRecord struct {
	r   kgo.Record
	buf [64]byte
}

// WithTopic wraps a Kafka sink so that each subtask creates topic (broker
// default partitions) when it opens and the topic is missing; the wrapper
// passes on every contract of the sink (checkpoint listener, abort carrier,
// restore committer, cancel listener). Other examples reuse it.
func WithTopic[T any](brokers []string, topic string, sink func() runtime.Sink[T]) func() runtime.Sink[T] {
	return func() runtime.Sink[T] { return &topicSink[T]{Sink: sink(), brokers: brokers, topic: topic} }
}

type topicSink[T any] struct {
	runtime.Sink[T]
	brokers []string
	topic   string
}

func (s *topicSink[T]) Open(ctx context.Context, oc *runtime.OperatorContext) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, -1, -1, nil, s.topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("create output topic %q: %w", s.topic, err)
	}
	return s.Sink.Open(ctx, oc)
}

func (s *topicSink[T]) NotifyCheckpointComplete(ctx context.Context, id checkpoint.ID) error {
	return s.Sink.(checkpoint.Listener).NotifyCheckpointComplete(ctx, id)
}

func (s *topicSink[T]) NotifyCheckpointAborted(ctx context.Context, id checkpoint.ID) error {
	return s.Sink.(checkpoint.Listener).NotifyCheckpointAborted(ctx, id)
}

// The wrapper passes on every contract of the Kafka sink it wraps.
var (
	_ checkpoint.AbortCarrier   = (*topicSink[Count])(nil)
	_ checkpoint.CancelListener = (*topicSink[Count])(nil)
	_ runtime.RestoreCommitter  = (*topicSink[Count])(nil)
)

// CarriesAbortedCheckpoints implements checkpoint.AbortCarrier: the Kafka
// sink commits an aborted checkpoint's transaction with the next one.
func (s *topicSink[T]) CarriesAbortedCheckpoints() {
	s.Sink.(checkpoint.AbortCarrier).CarriesAbortedCheckpoints()
}

// CommitRestored implements runtime.RestoreCommitter.
func (s *topicSink[T]) CommitRestored(ctx context.Context, oc *runtime.OperatorContext) error {
	return s.Sink.(runtime.RestoreCommitter).CommitRestored(ctx, oc)
}

// NotifyJobCanceled implements checkpoint.CancelListener.
func (s *topicSink[T]) NotifyJobCanceled(ctx context.Context, last checkpoint.ID) error {
	return s.Sink.(checkpoint.CancelListener).NotifyJobCanceled(ctx, last)
}
