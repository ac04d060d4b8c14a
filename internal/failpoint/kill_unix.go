//go:build unix

package failpoint

import (
	"os"
	"syscall"
	"time"
)

// killSelf sends SIGKILL to the current process: no deferred functions, no
// flushing, no cleanup, exactly like an OOM kill or a power cut of the process.
func killSelf() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	for {
		time.Sleep(time.Second) // wait for the signal to land
	}
}
