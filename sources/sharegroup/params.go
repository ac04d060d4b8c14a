package sharegroup

import (
	"context"
	"strings"

	"github.com/weirstream/weir/runtime"
)

// BrokersParam is the job parameter "brokers" (Kafka seed brokers, comma
// separated, default 127.0.0.1:9092: the embedded broker of streamctl
// local), as the bundled job types declare it.
func BrokersParam() runtime.ParamSpec {
	return runtime.ParamSpec{Name: "brokers", Default: "127.0.0.1:9092", Description: "Kafka seed brokers, comma separated"}
}

// ParamBrokers returns the seed brokers of p's "brokers" parameter.
func ParamBrokers(p runtime.Params) []string { return strings.Split(p.String("brokers"), ",") }

// CheckBrokersParam is a runtime.JobType Check: CheckBrokers on the brokers
// of p's "brokers" parameter.
func CheckBrokersParam(ctx context.Context, p runtime.Params) error {
	return CheckBrokers(ctx, ParamBrokers(p))
}

// EventTimeParams are the job parameters of event time on a share group,
// as the bundled job types declare them: "out-of-orderness" (5s), "idle"
// (10s) and "max-drift" (1m). ParamWatermarks reads them.
func EventTimeParams() []runtime.ParamSpec {
	return []runtime.ParamSpec{
		{Name: "out-of-orderness", Default: "5s", Description: "bound on how far event time may go back within a partition"},
		{Name: "idle", Default: "10s", Description: "a partition the group has finished that gets nothing new for this long does not hold the watermark back"},
		{Name: "max-drift", Default: "1m", Description: "watermark alignment: partitions more than this ahead of the watermark are not fetched until the others catch up (0: off)"},
	}
}

// ParamWatermarks is the watermark strategy of p's EventTimeParams: bounded
// out-of-orderness on the event time ts gives, idleness and alignment.
func ParamWatermarks[T any](p runtime.Params, ts func(T) int64) (runtime.WatermarkStrategy[T], error) {
	d, err := p.Durations("out-of-orderness", "idle", "max-drift")
	if err != nil {
		return runtime.WatermarkStrategy[T]{}, err
	}
	return runtime.ForBoundedOutOfOrderness[T](d[0],
		runtime.WithTimestampAssigner(func(v T, _ int64) int64 { return ts(v) }),
		runtime.WithIdleness(d[1]), runtime.WithWatermarkAlignment(d[2])), nil
}
