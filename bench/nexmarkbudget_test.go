package bench

import (
	"context"
	"testing"
)

// The standard-size runs on pebble get the RocksDB memory of the Flink
// runs they are compared with (789 MiB a slot, a slot per subtask) unless
// a budget is given; heap runs get none.
func TestNexmarkRunsOnPebbleGetFlinksManagedMemoryUnlessToldOtherwise(t *testing.T) {
	for _, tc := range []struct {
		name              string
		given             int64
		wantPebble, wantH int64
	}{
		{"by default", 0, 2 * 789 << 20, 0},
		{"a budget given", 512 << 20, 512 << 20, 512 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := map[string]int64{}
			cfg := Config{NexmarkBackends: []string{"heap", "pebble"}, NexmarkQueries: []string{"q1"}, NexmarkStateMemory: tc.given,
				NexmarkProcess: func(_ context.Context, spec NexmarkRunSpec) (NexmarkRunResult, error) {
					got[spec.Backend] = spec.StateMemory
					return NexmarkRunResult{Spec: spec, Wall: 1, CPU: 1}, nil
				}}
			if _, err := nexmarkStandard(t.Context(), cfg, 1000); err != nil {
				t.Fatal(err)
			}
			if got["pebble"] != tc.wantPebble || got["heap"] != tc.wantH {
				t.Errorf("budgets %v, want pebble %d and heap %d", got, tc.wantPebble, tc.wantH)
			}
		})
	}
}
