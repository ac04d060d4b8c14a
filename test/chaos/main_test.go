package chaos

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/weirstream/weir/internal/proctest"
)

// streamctlBin is the streamctl binary built once by TestMain.
var streamctlBin string

func TestMain(m *testing.M) {
	bin, remove, err := proctest.Build("../../cmd/streamctl", "streamctl")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	streamctlBin = bin
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	remove()
	os.Exit(code)
}
