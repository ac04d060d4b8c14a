package chaos

import (
	"os"
	"testing"

	"github.com/weirstream/weir/internal/proctest"
)

// streamctlBin is the streamctl binary built once by TestMain.
var streamctlBin string

func TestMain(m *testing.M) {
	os.Exit(proctest.Main(m, "../../cmd/streamctl", "streamctl", &streamctlBin))
}
