package wordcount

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkCountRecord measures the sink serializer of one count. The
// records are kept (as kgo keeps them until their promise fires), so they
// escape to the heap as in the sink.
func BenchmarkCountRecord(b *testing.B) {
	b.ReportAllocs()
	c := Count{Word: "exactly", Count: 12345}
	kept := make([]*kgo.Record, 0, 1024)
	for b.Loop() {
		if len(kept) == cap(kept) {
			kept = kept[:0]
		}
		kept = append(kept, CountRecord("counts", c))
	}
}
