//go:build unix

package broker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// errLocked means another process holds the data dir lock.
var errLocked = errors.New("locked")

// lockFile is the file in the data dir that the running broker holds an
// exclusive flock on, so two brokers never write one dir.
const lockFile = ".weir-broker.lock"

// lockDir takes an exclusive, non-blocking flock on dir's lock file. The lock
// dies with the process, so a crashed broker never leaves a stale lock.
func lockDir(dir string) (unlock func() error, err error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %w", errLocked, err)
		}
		return nil, err
	}
	return func() error {
		// Closing the descriptor releases the flock.
		return f.Close()
	}, nil
}
