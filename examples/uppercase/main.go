// Command uppercase is streamctl with a job type of its own: the way to
// deploy a custom job on a Weir cluster (README, "Your own jobs").
//
// Every node of a cluster builds jobs from their registered type name and
// parameters, so every node must run a binary that registers the type. This
// one registers "uppercase" (and the bundled wordcount) and hands the rest
// to cli.Main, which gives it every streamctl command:
//
//	go build -o uppercase ./examples/uppercase
//	./uppercase jobmanager --data-dir /var/lib/weir/jm
//	./uppercase taskmanager --jobmanager JM:6123        # on each machine
//	./uppercase submit uppercase --jobmanager JM:6123 --set brokers=KAFKA:9092
//
// The job reads the share group "uppercase" on the topic "lines" and writes
// each line upper-cased to the topic "upper", exactly once.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/cli"
	"github.com/weirstream/weir/examples/wordcount"
	"github.com/weirstream/weir/runtime"
	"github.com/weirstream/weir/sinks/kafka"
	"github.com/weirstream/weir/sources/sharegroup"
)

// Uppercase is the job type this binary adds.
var Uppercase = runtime.JobType{
	Name:        "uppercase",
	Description: "upper-cases every line of a share group into a topic, exactly once",
	Params: []runtime.ParamSpec{
		{Name: "brokers", Default: "127.0.0.1:9092", Description: "Kafka seed brokers, comma separated"},
		{Name: "input", Default: "lines", Description: "input topic (read as a share group)"},
		{Name: "group", Default: "uppercase", Description: "share group"},
		{Name: "output", Default: "upper", Description: "output topic (must exist)"},
	},
	Build: build,
	Check: func(ctx context.Context, p runtime.Params) error {
		return sharegroup.CheckBrokers(ctx, strings.Split(p.String("brokers"), ","))
	},
}

func build(p runtime.Params) (*runtime.Job, error) {
	brokers := strings.Split(p.String("brokers"), ",")
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
	j := runtime.NewJob("uppercase", opts...)
	lines := runtime.FromSource(j, "lines", src)
	upper := runtime.Map(lines, "upper", func(s string) (string, error) { return strings.ToUpper(s), nil })
	runtime.SinkTo(upper, "output", sink)
	return j, nil
}

func main() {
	reg := runtime.NewRegistry()
	for _, t := range []runtime.JobType{wordcount.Type, Uppercase} {
		if err := reg.Register(t); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	cli.Main(reg)
}
