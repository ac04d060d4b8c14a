package runtime

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// rssChildEnv makes the test binary the child of
// TestPebbleStateFarAboveTheBudgetKeepsPeakRSSBounded: "BUDGET:KEYS".
const rssChildEnv = "WEIR_PEBBLE_RSS_CHILD"

// rssValue is key i's value: 1 KiB derived from i.
func rssValue(i int) string {
	s := strconv.Itoa(i) + ":"
	return strings.Repeat(s, 1024/len(s)+1)[:1024]
}

// Keyed state far above the memory budget on the pebble backend, in a
// process of its own: every key written, then every value read back and
// checked, and the process's peak RSS (VmHWM) stays below a bound derived
// from the budget (twice the budget, plus 160 MiB for the Go runtime and
// the test binary), whatever the state's size. The default size is 128 MiB
// of state under a 32 MiB budget; WEIR_VOLUME=1 writes 2 GiB under 128 MiB
// (3 GiB measured 2026-12-06 on 2 loaded cores: peak RSS 135 MiB, 12
// minutes; 2 GiB keeps .ci/run's volume step shorter).
func TestPebbleStateFarAboveTheBudgetKeepsPeakRSSBounded(t *testing.T) {
	if spec := os.Getenv(rssChildEnv); spec != "" {
		rssChild(t, spec)
		return
	}
	if raceEnabled {
		t.Skip("peak RSS under the race detector measures the detector's shadow memory; .ci/run's volume step runs this without it")
	}
	budget, keys := int64(32<<20), 128<<10
	if os.Getenv("WEIR_VOLUME") != "" {
		budget, keys = 128<<20, 2<<20
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestPebbleStateFarAboveTheBudgetKeepsPeakRSSBounded$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d:%d", rssChildEnv, budget, keys), "TMPDIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var hwm int64 = -1
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "peak-rss-bytes "); ok {
			hwm, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if hwm < 0 {
		t.Fatalf("the child reported no peak RSS:\n%s", out)
	}
	state := int64(keys) * 1024
	bound := 2*budget + 160<<20
	t.Logf("%d MiB of state under a %d MiB budget: peak RSS %d MiB (bound %d MiB)", state>>20, budget>>20, hwm>>20, bound>>20)
	if hwm > bound {
		t.Fatalf("peak RSS %d MiB above the bound %d MiB (budget %d MiB, state %d MiB)", hwm>>20, bound>>20, budget>>20, state>>20)
	}
}

// rssChild writes and checks the state, then prints the peak RSS.
func rssChild(t *testing.T, spec string) {
	b, k, _ := strings.Cut(spec, ":")
	budget, _ := strconv.ParseInt(b, 10, 64)
	keys, _ := strconv.Atoi(k)
	mem, err := NewStateMemory(StateMemoryBudget(budget), StateDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	const maxPar = 128
	p, err := mem.openInstance("big", maxPar)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	kb := newKeyedBackend[int64](Int64Codec(), maxPar)
	kb.usePebble(p)
	v, err := NewValueState[string](&StateRegistry[int64]{b: kb}, "v", StringCodec())
	if err != nil {
		t.Fatal(err)
	}
	scope := func(i int) { kb.scope.setKey(int64(i), int(uint64(i)*0x9E3779B97F4A7C15>>57)%maxPar) }
	for i := range keys {
		scope(i)
		v.Update(rssValue(i))
	}
	for i := range keys {
		scope(i)
		got, ok := v.Value()
		if !ok || got != rssValue(i) {
			t.Fatalf("key %d: %q, %v", i, got, ok)
		}
	}
	t.Logf("state on disk: %d MiB", p.diskUsage()>>20)
	fmt.Printf("peak-rss-bytes %d\n", vmHWM(t))
}

// vmHWM is the process's peak resident set size (/proc/self/status).
func vmHWM(t *testing.T) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status:", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/self/status")
	return 0
}
