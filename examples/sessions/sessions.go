// Package sessions owns the sessions job, Weir's event-time example
// (DESIGN.md's "Sessions contract"): JSON clicks read from a share group
// (or, with --set source=kafka, the topic's partitions; examples/input),
// their ts as event time with bounded out-of-orderness and idleness,
// event-time session windows per user, one JSON summary per session to the
// output topic through an exactly-once Kafka sink, and late clicks (their
// session already fired) unchanged to the late topic through a second
// exactly-once sink. A value that is not a click goes to the source's
// dead-letter topic ("<group>-dlq").
//
// Like wordcount it uses only what a Weir user may use: runtime's operator
// API and the public connectors. streamctl registers it.
package sessions

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/input"
	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sinks/kafka"
	"github.com/weirstream/weir/sources/sharegroup"
)

// Name is the job type's registered name.
const Name = "sessions"

// Type is the sessions job type.
var Type = runtime.JobType{
	Name:        Name,
	Description: "event-time sessions: JSON clicks from a topic (share group or partitions) -> session windows per user -> summaries to output, late clicks to late, exactly once",
	Params: append(append([]runtime.ParamSpec{
		sharegroup.BrokersParam(),
		{Name: "input", Default: "clicks", Description: "input topic of JSON clicks"},
		{Name: "output", Default: "sessions", Description: "session summaries topic, created when missing"},
		{Name: "late", Default: "late-clicks", Description: "late clicks topic, created when missing"},
		{Name: "group", Default: "sessions", Description: "share group (source=sharegroup), or consumer group the offsets are committed to for monitoring (source=kafka)"},
		{Name: "gap", Default: "30s", Description: "session gap: a click more than gap after the previous one starts a new session (exactly gap after joins it, as in Flink)"},
	}, sharegroup.EventTimeParams()...), input.Params()...),
	Build: Build,
	Check: input.Check,
}

// Register adds the sessions job type to r.
func Register(r *runtime.Registry) error { return r.Register(Type) }

// ErrNotAClick is the cause of a record whose value is not a click; the
// source dead-letters such records.
var ErrNotAClick = errors.New("not a click")

// Click is an input click: the fields of its JSON value and the input
// record's key and value, kept unchanged for the late topic.
type Click struct {
	User  string `json:"user"`
	TS    int64  `json:"ts"`
	URL   string `json:"url"`
	Key   []byte `json:"key,omitempty"`
	Value []byte `json:"value"`
}

// Session is a session's summary: Start is its first click's ts, End its
// last click's ts plus the gap (exclusive, as a Flink window's end).
type Session struct {
	User   string `json:"user"`
	Start  int64  `json:"start"`
	End    int64  `json:"end"`
	Clicks int64  `json:"clicks"`
}

// ParseClick decodes a click record: its value must be a JSON object with a
// non-empty string "user" and an integer "ts" (epoch milliseconds); "url",
// when present, must be a string. Anything else fails with ErrNotAClick.
func ParseClick(r *kgo.Record) (Click, error) {
	var v struct {
		User *string `json:"user"`
		TS   *int64  `json:"ts"`
		URL  *string `json:"url"`
	}
	if err := json.Unmarshal(r.Value, &v); err != nil {
		return Click{}, fmt.Errorf("%w: %w", ErrNotAClick, err)
	}
	if v.User == nil || *v.User == "" || v.TS == nil {
		return Click{}, fmt.Errorf("%w: a non-empty \"user\" and a \"ts\" are required", ErrNotAClick)
	}
	c := Click{User: *v.User, TS: *v.TS, Key: r.Key, Value: r.Value}
	if v.URL != nil {
		c.URL = *v.URL
	}
	return c, nil
}

// SessionRecord is the output record of s on topic: key the user, value s
// as JSON.
func SessionRecord(topic string, s Session) (*kgo.Record, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encode session: %w", err)
	}
	return &kgo.Record{Topic: topic, Key: []byte(s.User), Value: b}, nil
}

// Build builds the sessions graph from its parameters.
func Build(p runtime.Params) (*runtime.Job, error) {
	gap, err := p.Duration("gap")
	if err != nil {
		return nil, err
	}
	wms, err := input.Watermarks(p, func(c Click) int64 { return c.TS })
	if err != nil {
		return nil, err
	}
	brokers := sharegroup.ParamBrokers(p)
	src, err := input.New(p, ParseClick, input.Config{Brokers: brokers, Topic: p.String("input"), Group: p.String("group")})
	if err != nil {
		return nil, err
	}
	output, lateTopic := p.String("output"), p.String("late")
	sessionSink, err := kafka.NewSink(func(s Session) (*kgo.Record, error) { return SessionRecord(output, s) },
		[]kafka.Opt{kafka.Brokers(brokers...), kafka.Guarantee(kafka.ExactlyOnce)})
	if err != nil {
		return nil, err
	}
	lateSink, err := kafka.NewSink(func(c Click) (*kgo.Record, error) {
		return &kgo.Record{Topic: lateTopic, Key: c.Key, Value: c.Value}, nil
	}, []kafka.Opt{kafka.Brokers(brokers...), kafka.Guarantee(kafka.ExactlyOnce)})
	if err != nil {
		return nil, err
	}
	jopts, err := p.JobOpts()
	if err != nil {
		return nil, err
	}

	j := runtime.NewJob(Name, jopts...)
	clicks := runtime.FromSource(j, "clicks", src, runtime.Watermarks(wms))
	byUser := runtime.KeyBy(clicks, func(c Click) string { return c.User }, nil)
	lateTag := runtime.NewOutputTag[Click]("late-clicks")
	windows := runtime.Window(byUser, runtime.EventTimeSessionWindows(gap), runtime.LateOutput(lateTag))
	sessions := runtime.AggregateProcess(windows, "sessions", countClicks{},
		runtime.ProcessWindowFunc[string, int64, Session](func(ctx *runtime.WindowContext[string], n []int64, out runtime.Collector[Session]) error {
			out.Collect(Session{User: ctx.Key, Start: ctx.Window.Start, End: ctx.Window.End, Clicks: n[0]})
			return nil
		}), nil)
	runtime.SinkTo(sessions, "output", wordcount.WithTopic(brokers, output, sessionSink))
	runtime.SinkTo(runtime.SideOutput(sessions, lateTag), "late", wordcount.WithTopic(brokers, lateTopic, lateSink))
	return j, nil
}

// countClicks counts a session's clicks.
type countClicks struct{}

func (countClicks) CreateAccumulator() int64   { return 0 }
func (countClicks) Add(_ Click, n int64) int64 { return n + 1 }
func (countClicks) GetResult(n int64) int64    { return n }
func (countClicks) Merge(a, b int64) int64     { return a + b }
