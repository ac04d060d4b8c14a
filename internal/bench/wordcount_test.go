package bench

import (
	"context"
	"testing"
)

func BenchmarkWeirWordcount(b *testing.B) {
	corpus := Corpus(1, 200_000, 10, 20_000)
	for i := 0; i < b.N; i++ {
		if _, err := weirWordcount(context.Background(), corpus, 2_000_000); err != nil {
			b.Fatal(err)
		}
	}
}
