//go:build !unix

package broker

import "errors"

// errLocked means another process holds the data dir lock.
var errLocked = errors.New("locked")

// lockDir does nothing where flock is unavailable: there, keeping two brokers
// off one data dir is up to the user.
func lockDir(string) (unlock func() error, err error) {
	return func() error { return nil }, nil
}
