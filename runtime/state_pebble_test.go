package runtime

import (
	"testing"
)

// testStateMemory is a small state memory in a test directory.
func testStateMemory(t testing.TB, opts ...StateMemoryOpt) *StateMemory {
	t.Helper()
	m, err := NewStateMemory(append([]StateMemoryOpt{StateDir(t.TempDir()), StateMemoryBudget(minStateMemory)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	})
	return m
}

// testPebbleState is a pebble instance closed at the end of the test.
func testPebbleState(t testing.TB, maxPar int) *pebbleState {
	t.Helper()
	p, err := testStateMemory(t).openInstance(t.Name(), maxPar)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.close(); err != nil {
			t.Error(err)
		}
	})
	return p
}
