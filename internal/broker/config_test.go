package broker

import (
	"errors"
	"strings"
	"testing"
)

// Broker configs are checked for range as well as type, before the broker
// starts: a value kfake would take silently (a negative delivery limit)
// is one clear error naming the key and its range.
func TestConfigValuesOutOfRangeAreRefused(t *testing.T) {
	for _, tc := range []struct {
		key, value, want string
	}{
		{"group.share.delivery.count.limit", "-5", "out of range [2, 10]"},
		{"group.share.delivery.count.limit", "11", "out of range [2, 10]"},
		{"group.share.record.lock.duration.ms", "10", "out of range [1000, 3600000]"},
		{"group.share.heartbeat.interval.ms", "0", "out of range [1, ...)"},
		{"log.retention.ms", "-2", "out of range [-1, ...)"},
		{"group.share.partition.max.record.locks", "ten", "not an integer"},
	} {
		t.Run(tc.key+"="+tc.value, func(t *testing.T) {
			err := validateConfigs(map[string]string{tc.key: tc.value})
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrInvalidConfig saying %q", err, tc.want)
			}
		})
	}
	for k, v := range defaultConfigMap() {
		if err := validateConfigs(map[string]string{k: v}); err != nil {
			t.Errorf("default %s=%s refused: %v", k, v, err)
		}
	}
	for _, ok := range []map[string]string{
		{"group.share.delivery.count.limit": "5"}, {"log.retention.ms": "-1"}, {"group.share.record.lock.duration.ms": "1200"},
	} {
		if err := validateConfigs(ok); err != nil {
			t.Errorf("%v refused: %v", ok, err)
		}
	}
}
