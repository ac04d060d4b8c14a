package cli

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the child get SIGKILL when this process dies, so a
// killed bench leaves no task manager behind.
func dieWithParent(c *exec.Cmd) { c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
