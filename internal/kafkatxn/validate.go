package kafkatxn

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/weirstream/weir/checkpoint"
)

// BrokerMaxTransactionTimeout reads transaction.max.timeout.ms from every
// broker (DescribeConfigs) and returns the smallest.
func BrokerMaxTransactionTimeout(ctx context.Context, admin *kadm.Client) (time.Duration, error) {
	const key = "transaction.max.timeout.ms"
	brokers, err := admin.ListBrokers(ctx)
	if err != nil {
		return 0, fmt.Errorf("list brokers: %w", err)
	}
	rcs, err := admin.DescribeBrokerConfigs(ctx, brokers.NodeIDs()...)
	if err != nil {
		return 0, fmt.Errorf("describe broker configs: %w", err)
	}
	var least time.Duration
	for _, rc := range rcs {
		if rc.Err != nil {
			return 0, fmt.Errorf("describe config of broker %s: %w", rc.Name, rc.Err)
		}
		for _, c := range rc.Configs {
			if c.Key != key || c.Value == nil {
				continue
			}
			ms, err := strconv.ParseInt(*c.Value, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("broker %s: %s=%q: %w", rc.Name, key, *c.Value, err)
			}
			if d := time.Duration(ms) * time.Millisecond; least == 0 || d < least {
				least = d
			}
		}
	}
	if least == 0 {
		return 0, fmt.Errorf("no broker reports %s", key)
	}
	return least, nil
}

// CheckTransactionTimeout is the job-start check of a transactional
// connector (the Kafka sink, the share-group source's ack-log producer): it
// refuses a transaction timeout that a pre-committed transaction could
// outlive under the job's checkpoint timing (txnTimeout must exceed
// t.MaxTransactionLifetime(), see checkpoint.Timing), or that the brokers
// refuse (above transaction.max.timeout.ms, read with DescribeConfigs).
// Errors about the values wrap ErrInvalidConfig and name every problem; an
// error reading the brokers' maximum is returned unwrapped, so a caller may
// log it and go on (the broker then refuses a bad timeout at
// InitProducerID). A zero Timing (an executor that gives none) checks only
// the brokers' maximum.
func CheckTransactionTimeout(ctx context.Context, admin *kadm.Client, txnTimeout time.Duration, t checkpoint.Timing) error {
	var errs []error
	if txnTimeout <= 0 {
		return fmt.Errorf("%w: transaction timeout %v must be positive", ErrInvalidConfig, txnTimeout)
	}
	if !t.IsZero() {
		if err := t.Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		if txnTimeout <= t.MaxTransactionLifetime() {
			errs = append(errs, fmt.Errorf("%w: transaction timeout %v must exceed the longest a pre-committed transaction can wait for its commit, %s, or the broker may abort it before the job commits it (data loss); raise the transaction timeout or shorten the checkpoint timing",
				ErrInvalidConfig, txnTimeout, t))
		}
	}
	maxTimeout, err := BrokerMaxTransactionTimeout(ctx, admin)
	if err != nil {
		if len(errs) > 0 {
			return errs[0]
		}
		return err
	}
	if txnTimeout > maxTimeout {
		errs = append(errs, fmt.Errorf("%w: transaction timeout %v exceeds the brokers' transaction.max.timeout.ms (%v); lower it or raise the broker setting",
			ErrInvalidConfig, txnTimeout, maxTimeout))
	}
	return errors.Join(errs...)
}

// ValidateTimeouts is CheckTransactionTimeout for a job known only by its
// checkpoint timeout and restart budget (one checkpoint, no tolerated
// failure, no interval): txnTimeout must exceed checkpointTimeout +
// restartBudget.
func ValidateTimeouts(ctx context.Context, admin *kadm.Client, txnTimeout, checkpointTimeout, restartBudget time.Duration) error {
	t := checkpoint.Timing{Timeout: checkpointTimeout, RestartBudget: restartBudget}
	if err := t.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return CheckTransactionTimeout(ctx, admin, txnTimeout, t)
}
