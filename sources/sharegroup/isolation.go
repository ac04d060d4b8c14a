package sharegroup

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Group configs a Source and a Session set on their share group.
const (
	// IsolationLevelConfig is the group config that says whether a share
	// group is handed records of open and aborted transactions
	// (read_uncommitted, Kafka's default and the embedded broker's) or
	// only committed ones (read_committed, what Weir needs).
	IsolationLevelConfig = "share.isolation.level"
	// readCommitted is the value of IsolationLevelConfig Weir sets.
	readCommitted = "read_committed"
	// autoOffsetResetConfig is where a new share group starts.
	autoOffsetResetConfig = "share.auto.offset.reset"
)

// ErrReadUncommitted is wrapped by the error with which a Source fails its
// job (unrecoverable) and a Session's NewSession or Poll fail when the share
// group's share.isolation.level is not read_committed: the group is then
// handed records of open and aborted transactions (an upstream Weir job's
// aborted checkpoints, re-queue copies that lost their race), and every one
// of them would be processed. The error names the group and the config.
var ErrReadUncommitted = errors.New("the share group does not read committed records only")

// prepareGroup sets the group configs a Source or Session needs before the
// group reads (IncrementalAlterConfigs, resource type GROUP):
// share.isolation.level=read_committed always, share.auto.offset.reset=
// earliest when resetEarliest; then it reads the isolation level back
// (checkIsolation), so that a broker that accepted the request without
// applying it is caught before anything is read.
func prepareGroup(ctx context.Context, cl *kgo.Client, group string, resetEarliest bool) error {
	if err := SetGroupConfig(ctx, cl, group, IsolationLevelConfig, readCommitted); err != nil {
		return err
	}
	if resetEarliest {
		if err := SetGroupConfig(ctx, cl, group, autoOffsetResetConfig, "earliest"); err != nil {
			return err
		}
	}
	return checkIsolation(ctx, cl, group)
}

// checkIsolation reads the group's share.isolation.level (DescribeConfigs,
// resource type GROUP) and returns an error wrapping ErrReadUncommitted,
// naming the group, the config and its value, unless it is read_committed.
// A failed request is returned as is (the caller decides whether to retry).
func checkIsolation(ctx context.Context, cl *kgo.Client, group string) error {
	value, reported, err := describeGroupConfig(ctx, cl, group, IsolationLevelConfig)
	if err != nil {
		return err
	}
	if !reported {
		return fmt.Errorf("%w: group %q: the broker does not report %s (it needs Apache Kafka 4.2+ share groups)",
			ErrReadUncommitted, group, IsolationLevelConfig)
	}
	v := "read_uncommitted (default)"
	if value != nil {
		v = *value
	}
	if v == readCommitted {
		return nil
	}
	return fmt.Errorf("%w: group %q has %s=%s: it would be handed records of open and aborted transactions; "+
		"Weir sets %s=%s on the group when a source or session opens, and it must stay so",
		ErrReadUncommitted, group, IsolationLevelConfig, v, IsolationLevelConfig, readCommitted)
}

// describeGroupConfig reads one config of a group (DescribeConfigs,
// resource type GROUP): its value (nil when the broker reports it without
// one) and whether the broker reported it at all. A failed request or a
// resource error is returned, naming the group.
func describeGroupConfig(ctx context.Context, cl *kgo.Client, group, key string) (value *string, reported bool, err error) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	res.ConfigNames = []string{key}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, false, fmt.Errorf("describe the configs of group %q: %w", group, err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return nil, false, fmt.Errorf("describe the configs of group %q: %w", group, err)
		}
		for _, c := range r.Configs {
			if c.Name == key {
				return c.Value, true, nil
			}
		}
	}
	return nil, false, nil
}
