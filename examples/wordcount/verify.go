package wordcount

import (
	"context"
	"fmt"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/sinks/kafka"
)

// Report is the outcome of Verify.
type Report struct {
	Words      int // distinct words expected
	Records    int // committed output records read
	Duplicates int // values seen again (a repeat)
	Lost       int // values missing (gaps, and counts short of n at the end)
	// Problems describes the first few violations.
	Problems []string
}

// OK reports whether the output is exactly-once.
func (r Report) OK() bool { return r.Duplicates == 0 && r.Lost == 0 && len(r.Problems) == 0 }

func (r Report) String() string {
	if r.OK() {
		return fmt.Sprintf("exactly-once verified: %d words, %d records, 0 duplicates, 0 lost", r.Words, r.Records)
	}
	return fmt.Sprintf("exactly-once VIOLATED: %d words, %d records, %d duplicates, %d lost; %v",
		r.Words, r.Records, r.Duplicates, r.Lost, r.Problems)
}

// Expected counts the occurrences of every word in lines.
func Expected(lines []string) map[string]int {
	want := map[string]int{}
	for _, l := range lines {
		for _, w := range Words(l) {
			want[w]++
		}
	}
	return want
}

// Verify reads the output topic read_committed and checks the contract: for
// each word the values, in offset order, are exactly 1, 2, ..., n with n its
// number of occurrences (want). A repeat, or a value above n, is a
// duplicate; a gap a loss.
func Verify(ctx context.Context, brokers []string, output string, want map[string]int, opts ...kgo.Opt) (Report, error) {
	recs, err := kafka.ReadCommitted(ctx, brokers, output, opts...)
	if err != nil {
		return Report{}, err
	}
	return Check(recs, want), nil
}

// Check applies Verify's rule to records already read (partition, then
// offset order; a word's records share a partition).
func Check(recs []*kgo.Record, want map[string]int) Report {
	rep := Report{Words: len(want), Records: len(recs)}
	problem := func(f string, a ...any) {
		if len(rep.Problems) < 5 {
			rep.Problems = append(rep.Problems, fmt.Sprintf(f, a...))
		}
	}
	last := map[string]int{}
	for _, r := range recs {
		w := string(r.Key)
		n, err := strconv.Atoi(string(r.Value))
		if err != nil {
			problem("word %q: value %q at %d/%d is not a count", w, r.Value, r.Partition, r.Offset)
			continue
		}
		if _, ok := want[w]; !ok {
			problem("word %q was never in the input", w)
			continue
		}
		switch prev := last[w]; {
		case n > want[w]:
			// More records of the word than it has occurrences: an
			// extra, whatever it repeats or skips.
			rep.Duplicates++
			problem("word %q: %d beyond its %d occurrences at %d/%d", w, n, want[w], r.Partition, r.Offset)
		case n <= prev:
			rep.Duplicates++
			problem("word %q: %d after %d (duplicate) at %d/%d", w, n, prev, r.Partition, r.Offset)
		case n > prev+1:
			rep.Lost += n - prev - 1
			problem("word %q: %d after %d (lost %d) at %d/%d", w, n, prev, n-prev-1, r.Partition, r.Offset)
			last[w] = n
		default:
			last[w] = n
		}
	}
	for w, n := range want {
		if last[w] < n {
			rep.Lost += n - last[w]
			problem("word %q: reached %d of %d", w, last[w], n)
		}
	}
	return rep
}
