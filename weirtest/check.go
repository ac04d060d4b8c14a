package weirtest

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ExactlyOnceError is the error of the exactly-once checks: how many
// records repeat (or exceed what the input can explain), how many are
// missing, how many the input cannot explain at all, and the first few
// violations.
type ExactlyOnceError struct {
	Duplicates, Lost, Unexpected int
	Problems                     []string
}

func (e *ExactlyOnceError) Error() string {
	return fmt.Sprintf("exactly-once violated: %d duplicates, %d lost, %d unexpected; %s",
		e.Duplicates, e.Lost, e.Unexpected, strings.Join(e.Problems, "; "))
}

func (e *ExactlyOnceError) problem(f string, a ...any) {
	if len(e.Problems) < 10 {
		e.Problems = append(e.Problems, fmt.Sprintf(f, a...))
	}
}

func (e *ExactlyOnceError) orNil() error {
	if e.Duplicates == 0 && e.Lost == 0 && e.Unexpected == 0 && len(e.Problems) == 0 {
		return nil
	}
	return e
}

// CheckRunningCounts checks output of the running-count shape: one record
// per input occurrence of a key, keyed by it, whose value is the key's
// running count in decimal (Weir's wordcount). recs are read_committed in
// offset order (Kafka.ReadCommitted; a key's records share a partition).
// For every key of want the values must be exactly 1, 2, ..., want[key]: a
// repeat, or a value beyond want[key], is a duplicate; a gap, or a count
// short of want[key] at the end, a loss; a key not in want is unexpected.
// It returns nil or an *ExactlyOnceError.
func CheckRunningCounts(recs []*kgo.Record, want map[string]int) error {
	e := &ExactlyOnceError{}
	last := map[string]int{}
	for _, r := range recs {
		key := string(r.Key)
		n, err := strconv.Atoi(string(r.Value))
		if err != nil {
			e.Unexpected++
			e.problem("key %q: value %q at %d/%d is not a count", key, r.Value, r.Partition, r.Offset)
			continue
		}
		total, ok := want[key]
		if !ok {
			e.Unexpected++
			e.problem("key %q was never in the input", key)
			continue
		}
		switch prev := last[key]; {
		case n > total:
			e.Duplicates++
			e.problem("key %q: %d beyond its %d occurrences at %d/%d", key, n, total, r.Partition, r.Offset)
		case n <= prev:
			e.Duplicates++
			e.problem("key %q: %d after %d (duplicate) at %d/%d", key, n, prev, r.Partition, r.Offset)
		case n > prev+1:
			e.Lost += n - prev - 1
			e.problem("key %q: %d after %d (lost %d) at %d/%d", key, n, prev, n-prev-1, r.Partition, r.Offset)
			last[key] = n
		default:
			last[key] = n
		}
	}
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if last[k] < want[k] {
			e.Lost += want[k] - last[k]
			e.problem("key %q: reached %d of %d", k, last[k], want[k])
		}
	}
	return e.orNil()
}

// CheckEachOnce checks that got holds every element of want exactly as
// often as want does (each once, for a set), in any order, and nothing
// else: a surplus is a duplicate, a shortfall a loss, an element want does
// not hold is unexpected. It returns nil or an *ExactlyOnceError.
func CheckEachOnce(got, want []string) error {
	e := &ExactlyOnceError{}
	count := map[string]int{}
	for _, w := range want {
		count[w]++
	}
	seen := map[string]int{}
	for _, g := range got {
		seen[g]++
	}
	elems := make([]string, 0, len(seen)+len(count))
	for g := range seen {
		elems = append(elems, g)
	}
	for w := range count {
		if _, ok := seen[w]; !ok {
			elems = append(elems, w)
		}
	}
	sort.Strings(elems)
	for _, x := range elems {
		n, w := seen[x], count[x]
		switch {
		case w == 0:
			e.Unexpected += n
			e.problem("%q (%d times) was never expected", x, n)
		case n > w:
			e.Duplicates += n - w
			e.problem("%q %d times, want %d", x, n, w)
		case n < w:
			e.Lost += w - n
			e.problem("%q %d times, want %d", x, n, w)
		}
	}
	return e.orNil()
}

// Values returns the records' values as strings, in order.
func Values(recs []*kgo.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = string(r.Value)
	}
	return out
}
