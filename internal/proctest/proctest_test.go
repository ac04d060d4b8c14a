package proctest

import (
	"flag"
	"strconv"
	"testing"
)

// DefaultParallel sets go test's -parallel when the command line did not
// give it, and leaves a given one alone.
func TestDefaultParallelSetsParallelUnlessTheCommandLineGaveIt(t *testing.T) {
	f := flag.Lookup("test.parallel")
	was := f.Value.String()
	t.Cleanup(func() {
		if err := f.Value.Set(was); err != nil {
			t.Error(err)
		}
	})
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	want := 7
	if given {
		want, _ = strconv.Atoi(was)
	}
	DefaultParallel(7)
	if got := f.Value.String(); got != strconv.Itoa(want) {
		t.Fatalf("-parallel %s after DefaultParallel(7) (given on the command line: %v), want %d", got, given, want)
	}
}
