package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDemoVerifiesExactlyOnceAfterAnInjectedFailure(t *testing.T) {
	var out bytes.Buffer
	if err := Run(context.Background(), &out, Config{Lines: 3000}); err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{"restarted 1 time(s)", "exactly-once verified:", "0 duplicates, 0 lost"} {
		if !strings.Contains(s, want) {
			t.Fatalf("demo output lacks %q:\n%s", want, s)
		}
	}
}
