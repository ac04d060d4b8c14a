package kafka

import (
	"fmt"
	"strings"

	"github.com/weirstream/weir/runtime"
)

// The values of the bundled jobs' "source" parameter (SourceParam).
const (
	SourceShareGroup = "sharegroup"
	SourceKafka      = "kafka"
)

// SourceParam is the job parameter "source" of the bundled job types that
// read Kafka: "sharegroup" (the default: the share group "group") or
// "kafka" (this source: the topic's partitions, offsets in checkpoint
// state, committed to the consumer group "group" for monitoring only).
func SourceParam() runtime.ParamSpec {
	return runtime.ParamSpec{Name: "source", Default: SourceShareGroup,
		Description: "sharegroup (share group, the default) or kafka (partitions, offsets in checkpoints, replayable)"}
}

// ParamUsesKafka reports whether p's "source" parameter asks for this
// source; an unknown value is an error wrapping runtime.ErrBadParam.
func ParamUsesKafka(p runtime.Params) (bool, error) {
	switch v := p.String("source"); v {
	case "", SourceShareGroup:
		return false, nil
	case SourceKafka:
		return true, nil
	default:
		return false, fmt.Errorf("%w: source=%q: want %s or %s", runtime.ErrBadParam, v, SourceShareGroup, SourceKafka)
	}
}

// ParamOpts are the options of a bundled job's source from its parameters:
// the brokers of "brokers" (comma separated), the topic named by the
// parameter topicParam, the consumer group of "group" (for monitoring),
// from the earliest offset.
func ParamOpts(p runtime.Params, topicParam string) []Opt {
	return []Opt{Brokers(strings.Split(p.String("brokers"), ",")...), Topics(p.String(topicParam)),
		Group(p.String("group")), StartAt(Earliest())}
}

// ParamWatermarks is the watermark strategy of a bundled event-time job on
// this source: bounded out-of-orderness "out-of-orderness" within a
// partition on the event time ts gives, per partition, and idleness "idle"
// per partition (a "max-drift" parameter is the share group's, ignored:
// each partition is read by one subtask in order).
func ParamWatermarks[T any](p runtime.Params, ts func(T) int64) (runtime.WatermarkStrategy[T], error) {
	d, err := p.Durations("out-of-orderness", "idle")
	if err != nil {
		return runtime.WatermarkStrategy[T]{}, err
	}
	return runtime.ForBoundedOutOfOrderness[T](d[0],
		runtime.WithTimestampAssigner(func(v T, _ int64) int64 { return ts(v) }),
		runtime.WithIdleness(d[1])), nil
}
