package kafkatxn

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// BrokerMaxTransactionTimeout reads transaction.max.timeout.ms from every
// broker (DescribeConfigs) and returns the smallest.
func BrokerMaxTransactionTimeout(ctx context.Context, admin *kadm.Client) (time.Duration, error) {
	const key = "transaction.max.timeout.ms"
	brokers, err := admin.ListBrokers(ctx)
	if err != nil {
		return 0, fmt.Errorf("kafkatxn: list brokers: %w", err)
	}
	rcs, err := admin.DescribeBrokerConfigs(ctx, brokers.NodeIDs()...)
	if err != nil {
		return 0, fmt.Errorf("kafkatxn: describe broker configs: %w", err)
	}
	var least time.Duration
	for _, rc := range rcs {
		if rc.Err != nil {
			return 0, fmt.Errorf("kafkatxn: describe config of broker %s: %w", rc.Name, rc.Err)
		}
		for _, c := range rc.Configs {
			if c.Key != key || c.Value == nil {
				continue
			}
			ms, err := strconv.ParseInt(*c.Value, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("kafkatxn: broker %s: %s=%q: %w", rc.Name, key, *c.Value, err)
			}
			if d := time.Duration(ms) * time.Millisecond; least == 0 || d < least {
				least = d
			}
		}
	}
	if least == 0 {
		return 0, fmt.Errorf("kafkatxn: no broker reports %s", key)
	}
	return least, nil
}

// ValidateTimeouts checks, at job submission, that a pre-committed
// transaction cannot time out before the job can commit it: txnTimeout must
// exceed checkpointTimeout (the longest a transaction stays pre-committed
// while its checkpoint completes) plus restartBudget (the worst-case time to
// detect a failure, restart and run Recover), and must not exceed the
// brokers' transaction.max.timeout.ms, read with DescribeConfigs. Errors
// about the values wrap ErrInvalidConfig.
func ValidateTimeouts(ctx context.Context, admin *kadm.Client, txnTimeout, checkpointTimeout, restartBudget time.Duration) error {
	switch {
	case txnTimeout <= 0:
		return fmt.Errorf("%w: transaction timeout %v must be positive", ErrInvalidConfig, txnTimeout)
	case checkpointTimeout <= 0:
		return fmt.Errorf("%w: checkpoint timeout %v must be positive", ErrInvalidConfig, checkpointTimeout)
	case restartBudget < 0:
		return fmt.Errorf("%w: restart budget %v must not be negative", ErrInvalidConfig, restartBudget)
	case txnTimeout <= checkpointTimeout+restartBudget:
		return fmt.Errorf("%w: transaction timeout %v must exceed checkpoint timeout %v + restart budget %v = %v, or a pre-committed transaction may be aborted by the broker before recovery commits it (data loss)",
			ErrInvalidConfig, txnTimeout, checkpointTimeout, restartBudget, checkpointTimeout+restartBudget)
	}
	maxTimeout, err := BrokerMaxTransactionTimeout(ctx, admin)
	if err != nil {
		return err
	}
	if txnTimeout > maxTimeout {
		return fmt.Errorf("%w: transaction timeout %v exceeds the brokers' transaction.max.timeout.ms (%v); lower it or raise the broker setting",
			ErrInvalidConfig, txnTimeout, maxTimeout)
	}
	return nil
}
