//go:build !linux

package cli

import "os/exec"

// dieWithParent is a no-op where the OS cannot tie a child's life to its
// parent's.
func dieWithParent(*exec.Cmd) {}

// maxRSS is 0 where the child's peak resident set size is not known here
// (the child reports its own where it can).
func maxRSS(*exec.Cmd) int64 { return 0 }
