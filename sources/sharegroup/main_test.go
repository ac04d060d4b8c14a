package sharegroup

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/weirstream/weir/internal/broker/brokerproc"
)

// TestMain checks every test of the package (source and session) for leaked
// goroutines.
func TestMain(m *testing.M) {
	brokerproc.Main() // a child process started by brokerproc.Start runs a broker here
	goleak.VerifyTestMain(m)
}
