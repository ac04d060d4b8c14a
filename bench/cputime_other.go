//go:build !unix

package bench

import "time"

// cpuTime is unavailable: the nexmark benchmark needs getrusage.
func cpuTime() (time.Duration, bool) { return 0, false }
