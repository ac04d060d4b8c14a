package bench

import "testing"

// state-memory reports, for value entries, map entries and timers, the heap
// per entry against the snapshot's bytes per entry: the snapshot holds at
// least an int64 key and value (or timestamp) per entry, and the heap at
// least as much as the snapshot.
func TestStateMemoryReportsHeapAndEncodedBytesPerEntry(t *testing.T) {
	lines, err := StateMemory(t.Context(), Config{tiny: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"heap_bytes_per_value_entry", "heap_bytes_per_map_entry", "heap_bytes_per_timer"}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d: %+v", len(lines), len(want), lines)
	}
	for i, l := range lines {
		if l.Bench != "state-memory" || l.Metric != want[i] || l.Baseline != "encoded-snapshot-bytes" {
			t.Errorf("line %d = %+v, want state-memory %s against encoded-snapshot-bytes", i, l, want[i])
		}
		if l.BaselineValue < 2 || l.Value < l.BaselineValue || l.Ratio < 1 {
			t.Errorf("%s: heap %.1f, encoded %.1f bytes per entry, ratio %.2f: want at least 2 encoded bytes and no less heap", l.Metric, l.Value, l.BaselineValue, l.Ratio)
		}
		t.Logf("%s: heap %.1f bytes, encoded %.1f bytes per entry", l.Metric, l.Value, l.BaselineValue)
	}
}
