package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
)

// byteSize is a flag holding a number of bytes: a plain number or one with
// a unit (KiB, MiB, GiB, TiB; KB, MB, GB, TB in powers of ten).
type byteSize int64

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
}

func (b *byteSize) String() string {
	if *b == 0 {
		return "0"
	}
	for _, u := range sizeUnits[:4] {
		if v := int64(*b); v%u.mult == 0 && v/u.mult < 1024 {
			return strconv.FormatInt(v/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(*b), 10)
}

func (b *byteSize) Set(s string) error {
	n, mult := strings.TrimSpace(s), int64(1)
	for _, u := range sizeUnits {
		if rest, ok := strings.CutSuffix(n, u.suffix); ok {
			n, mult = strings.TrimSpace(rest), u.mult
			break
		}
	}
	v, err := strconv.ParseInt(n, 10, 64)
	if err != nil || v < 0 {
		return fmt.Errorf("%q: want a number of bytes, e.g. 512MiB", s)
	}
	*b = byteSize(v * mult)
	return nil
}

func (b *byteSize) Type() string { return "size" }

// addStateMemory adds --state-memory: the memory budget of the pebble state
// backend per task manager (run: per run).
func addStateMemory(cmd *cobra.Command, b *byteSize) {
	// The help names no value: the reference page is generated from it
	// and must not depend on the machine that generates it.
	cmd.Flags().Var(b, "state-memory",
		"memory budget of the pebble state backend per task manager, shared by its tasks: half block cache, half memtables (default: an eighth of the machine's memory or of its container's limit where lower, at least 256MiB)")
}
