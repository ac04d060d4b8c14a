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
