//go:build unix

package storage

import "syscall"

// openNoBlock keeps opening a FIFO swapped in for a state file from
// blocking; regular files ignore it.
const openNoBlock = syscall.O_NONBLOCK
