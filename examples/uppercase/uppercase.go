// Package uppercase owns the uppercase job: a share group on the input topic,
// each line upper-cased, an exactly-once Kafka sink to the output topic. It
// is the smallest exactly-once job, and the one chained in front of the
// wordcount in the tests of two Weir jobs connected through a topic.
//
// Like wordcount it uses only what a Weir user may use: runtime's operator
// API and the public connectors. streamctl registers it; cmd/uppercase shows
// a binary of one's own registering it.
package uppercase

import (
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sinks/kafka"
	"github.com/weirstream/weir/sources/sharegroup"
)

// Name is the job type's registered name.
const Name = "uppercase"

// Type is the uppercase job type.
var Type = runtime.JobType{
	Name:        Name,
	Description: "upper-cases every line of a share group into a topic, exactly once",
	Params: []runtime.ParamSpec{
		sharegroup.BrokersParam(),
		{Name: "input", Default: "lines", Description: "input topic (read as a share group)"},
		{Name: "group", Default: "uppercase", Description: "share group"},
		{Name: "output", Default: "upper", Description: "output topic (must exist)"},
	},
	Build: Build,
	Check: sharegroup.CheckBrokersParam,
}

// Register adds the uppercase job type to r.
func Register(r *runtime.Registry) error { return r.Register(Type) }

// Build builds the uppercase graph from its parameters.
func Build(p runtime.Params) (*runtime.Job, error) {
	brokers := sharegroup.ParamBrokers(p)
	src, err := sharegroup.New(func(r *kgo.Record) (string, error) { return string(r.Value), nil },
		sharegroup.Brokers(brokers...), sharegroup.Topics(p.String("input")), sharegroup.Group(p.String("group")))
	if err != nil {
		return nil, err
	}
	output := p.String("output")
	sink, err := kafka.NewSink(func(s string) (*kgo.Record, error) { return &kgo.Record{Topic: output, Value: []byte(s)}, nil },
		[]kafka.Opt{kafka.Brokers(brokers...), kafka.Guarantee(kafka.ExactlyOnce)})
	if err != nil {
		return nil, err
	}
	opts, err := p.JobOpts()
	if err != nil {
		return nil, err
	}
	j := runtime.NewJob(Name, opts...)
	lines := runtime.FromSource(j, "lines", src)
	upper := runtime.Map(lines, "upper", func(s string) (string, error) { return strings.ToUpper(s), nil })
	runtime.SinkTo(upper, "output", sink)
	return j, nil
}
