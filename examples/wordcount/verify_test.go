package wordcount_test

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/weirstream/weir/examples/wordcount"
)

// Check accepts exactly 1..n per word and flags every other shape.
func TestCheckAcceptsExactlyOneToNPerWord(t *testing.T) {
	want := map[string]int{"a": 2, "b": 1}
	for _, tc := range []struct {
		name       string
		out        string // word=count, in offset order
		duplicates int
		lost       int
	}{
		{"exact", "a=1 b=1 a=2", 0, 0},
		{"repeat", "a=1 a=1 a=2 b=1", 1, 0},
		{"gap", "a=2 b=1", 0, 1},
		{"short", "a=1 b=1", 0, 1},
		{"beyond n", "a=1 a=2 a=3 b=1", 1, 0},
		{"foreign word", "a=1 a=2 b=1 ghost=1", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var recs []*kgo.Record
			for _, f := range strings.Fields(tc.out) {
				w, n, _ := strings.Cut(f, "=")
				recs = append(recs, &kgo.Record{Key: []byte(w), Value: []byte(n)})
			}
			rep := wordcount.Check(recs, want)
			if rep.Duplicates != tc.duplicates || rep.Lost != tc.lost || rep.OK() != (tc.name == "exact") {
				t.Fatalf("Check(%s) = %s; want %d duplicates, %d lost", tc.out, rep, tc.duplicates, tc.lost)
			}
		})
	}
}
