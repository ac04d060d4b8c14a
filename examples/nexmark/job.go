// Package nexmark is the Nexmark benchmark on Weir: the event generator
// (people, auctions and bids of an online auction site, written from the
// published specification of the Beam and nexmark-flink generators), a
// parallel, checkpointed, rescalable source of its events, and the queries
// q0, q1, q2, q3, q4, q5, q7, q8, q11 and q14 as the job type "nexmark".
//
// A query reads either the generator in-process or a topic `streamctl
// nexmark generate` filled with the same events as JSON (a share group, or
// the partition source: examples/input), and
// writes to a discarding sink or, exactly once, to a Kafka topic as JSON.
// docs/guide/nexmark.md defines each query and how to check it.
//
// Like wordcount it uses only what a Weir user may use: runtime's operator
// API and the public connectors. streamctl registers it.
package nexmark

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/input"
	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sinks/kafka"
	"github.com/weirstream/weir/sources/sharegroup"
)

// Name is the job type's registered name.
const Name = "nexmark"

// Source and sink choices of the job type.
const (
	SourceGenerator  = "generator"
	SourceShareGroup = input.ShareGroup
	SourceKafka      = input.Partitions
	SinkDiscard      = "discard"
	SinkKafka        = "kafka"
)

// Type is the nexmark job type.
var Type = runtime.JobType{
	Name:        Name,
	Description: "a Nexmark query (q0 q1 q2 q3 q4 q5 q7 q8 q11 q14) on generated auction events, to a discarding sink or a Kafka topic exactly once",
	Params: append(append([]runtime.ParamSpec{
		{Name: "query", Default: "q0", Description: "the query: " + joinNames()},
		{Name: "source", Default: SourceGenerator, Description: "generator (in-process), sharegroup (a share group on topic's JSON events, see streamctl nexmark generate) or kafka (topic's partitions, offsets in checkpoint state)"},
		{Name: "sink", Default: SinkDiscard, Description: "discard, or kafka (JSON results to output, exactly once)"},
		{Name: "events", Default: "1000000", Description: "generator: number of events (0: no end)"},
		{Name: "rate", Default: "10000", Description: "generator: events per second of event time (sets event times; does not throttle)"},
		{Name: "base-time", Default: strconv.FormatInt(DefaultBaseTime, 10), Description: "generator: time of event 0, epoch ms"},
		{Name: "out-of-order-group", Default: "1", Description: "generator: permute event ids within groups of this many events (1: none)"},
		sharegroup.BrokersParam(),
		{Name: "topic", Default: "nexmark", Description: "sharegroup, kafka: input topic of JSON events"},
		{Name: "group", Default: "nexmark", Description: "sharegroup: share group; kafka: consumer group the offsets are committed to for monitoring"},
		{Name: "output", Default: "nexmark-results", Description: "kafka sink: output topic, created when missing"},
		{Name: "q3-state-ttl", Default: "0", Description: "q3: time-to-live of the join's state, processing time since its last write (0: none; e.g. 1h)"},
	}, sharegroup.EventTimeParams()...), input.OffsetParams()...),
	Build: Build,
	Check: check,
}

// Register adds the nexmark job type to r.
func Register(r *runtime.Registry) error { return r.Register(Type) }

// check checks the brokers when the job uses Kafka.
func check(ctx context.Context, p runtime.Params) error {
	switch {
	case p.String("source") == SourceShareGroup || p.String("source") == SourceKafka:
		return input.Check(ctx, p)
	case p.String("sink") == SinkKafka:
		return sharegroup.CheckBrokersParam(ctx, p)
	}
	return nil
}

// Sinks says where a query's results go: Collect, when set, receives every
// result (tests); else Kafka, when Brokers is set, writes them as JSON to
// Topic exactly once; else they are discarded.
type Sinks struct {
	Brokers []string
	Topic   string
	Collect func(v any)
}

// query adds one query to a job: its operators on events and its sink.
type query func(events *runtime.Stream[Event], sinks Sinks) error

// queries are the queries by name.
var queries = map[string]query{
	"q0":  attach(Q0),
	"q1":  attach(Q1),
	"q2":  attach(Q2),
	"q3":  attach(Q3),
	"q4":  attach(Q4),
	"q5":  attach(Q5),
	"q7":  attach(Q7),
	"q8":  attach(Q8),
	"q11": attach(Q11),
	"q14": attach(Q14),
}

// Queries lists the query names in order.
func Queries() []string {
	names := make([]string, 0, len(queries))
	for n := range queries {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int {
		x, _ := strconv.Atoi(a[1:])
		y, _ := strconv.Atoi(b[1:])
		return x - y
	})
	return names
}

func joinNames() string { return strings.Join(Queries(), ", ") }

// attach makes a query of a function building its result stream.
func attach[R any](build func(*runtime.Stream[Event]) *runtime.Stream[R]) query {
	return func(events *runtime.Stream[Event], sinks Sinks) error {
		out := build(events)
		switch {
		case sinks.Collect != nil:
			runtime.SinkTo(out, "results", runtime.SinkFunc(func(_ context.Context, v R) error {
				sinks.Collect(v)
				return nil
			}))
		case len(sinks.Brokers) > 0:
			topic := sinks.Topic
			sink, err := kafka.NewSink(func(v R) (*kgo.Record, error) {
				b, err := json.Marshal(v)
				if err != nil {
					return nil, fmt.Errorf("encode result: %w", err)
				}
				return &kgo.Record{Topic: topic, Value: b}, nil
			}, []kafka.Opt{kafka.Brokers(sinks.Brokers...), kafka.Guarantee(kafka.ExactlyOnce)})
			if err != nil {
				return err
			}
			runtime.SinkTo(out, "results", wordcount.WithTopic(sinks.Brokers, topic, sink))
		default:
			runtime.SinkTo(out, "results", runtime.SinkFunc(func(context.Context, R) error { return nil }))
		}
		return nil
	}
}

// AddQuery adds the named query on events to its job, with its sink.
func AddQuery(name string, events *runtime.Stream[Event], sinks Sinks) error {
	q, ok := queries[name]
	if !ok {
		return fmt.Errorf("%w: query=%q, want one of %s", runtime.ErrBadParam, name, joinNames())
	}
	return q(events, sinks)
}

// GeneratorParams reads the generator's configuration from p.
func GeneratorParams(p runtime.Params) (GeneratorConfig, error) {
	var c GeneratorConfig
	for _, f := range []struct {
		name string
		v    *int64
	}{{"events", &c.Events}, {"rate", &c.Rate}, {"base-time", &c.BaseTime}, {"out-of-order-group", &c.OutOfOrderGroup}} {
		v, err := strconv.ParseInt(p.String(f.name), 10, 64)
		if err != nil {
			return c, fmt.Errorf("%w: %s=%q is not an integer", runtime.ErrBadParam, f.name, p.String(f.name))
		}
		*f.v = v
	}
	if _, err := NewGenerator(c); err != nil {
		return c, fmt.Errorf("%w: %w", runtime.ErrBadParam, err)
	}
	return c, nil
}

// GeneratorJob returns a job named name reading the generator g in-process
// (parallel, checkpointed, rescalable) and the stream of its events.
func GeneratorJob(name string, g *Generator, opts ...runtime.JobOpt) (*runtime.Job, *runtime.Stream[Event]) {
	j := runtime.NewJob(name, opts...)
	return j, runtime.FromSource(j, "events", Source(g), Watermarks())
}

// ParseEvent decodes a Kafka record of `streamctl nexmark generate`.
func ParseEvent(r *kgo.Record) (Event, error) { return UnmarshalEvent(r.Value) }

// Build builds the nexmark job from its parameters.
func Build(p runtime.Params) (*runtime.Job, error) {
	src, err := p.OneOf("source", SourceGenerator, SourceShareGroup, SourceKafka)
	if err != nil {
		return nil, err
	}
	snk, err := p.OneOf("sink", SinkDiscard, SinkKafka)
	if err != nil {
		return nil, err
	}
	jopts, err := p.JobOpts()
	if err != nil {
		return nil, err
	}
	var (
		j      *runtime.Job
		events *runtime.Stream[Event]
	)
	brokers := sharegroup.ParamBrokers(p)
	switch src {
	case SourceGenerator:
		c, err := GeneratorParams(p)
		if err != nil {
			return nil, err
		}
		g, _ := NewGenerator(c)
		j, events = GeneratorJob(Name, g, jopts...)
	case SourceShareGroup, SourceKafka:
		wms, err := input.Watermarks(p, Event.Time)
		if err != nil {
			return nil, err
		}
		s, err := input.New(p, ParseEvent, input.Config{Brokers: brokers, Topic: p.String("topic"), Group: p.String("group")})
		if err != nil {
			return nil, err
		}
		j = runtime.NewJob(Name, jopts...)
		events = runtime.FromSource(j, "events", s, runtime.Watermarks(wms))
	}
	sinks := Sinks{}
	if snk == SinkKafka {
		sinks = Sinks{Brokers: brokers, Topic: p.String("output")}
	}
	var ttl time.Duration
	if p.String("q3-state-ttl") != "" {
		if ttl, err = p.Duration("q3-state-ttl"); err != nil {
			return nil, err
		}
	}
	if q := p.String("query"); q == "q3" && ttl > 0 {
		err = attach(Q3WithStateTTL(ttl))(events, sinks)
	} else {
		err = AddQuery(q, events, sinks)
	}
	if err != nil {
		return nil, err
	}
	return j, nil
}
