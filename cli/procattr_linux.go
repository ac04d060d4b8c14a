package cli

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the child get SIGKILL when this process dies, so a
// killed bench leaves no task manager behind.
func dieWithParent(c *exec.Cmd) { c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }

// maxRSS is the peak resident set size in bytes of an exited child (its
// rusage maxrss, in KiB on Linux; 0 if unknown).
func maxRSS(c *exec.Cmd) int64 {
	if c.ProcessState == nil {
		return 0
	}
	if ru, ok := c.ProcessState.SysUsage().(*syscall.Rusage); ok {
		return ru.Maxrss << 10
	}
	return 0
}
