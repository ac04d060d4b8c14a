//go:build !linux

package cli

import "os/exec"

// dieWithParent is a no-op where the OS cannot tie a child's life to its
// parent's.
func dieWithParent(*exec.Cmd) {}
