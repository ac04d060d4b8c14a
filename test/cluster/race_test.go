//go:build race

package cluster

// raceEnabled: the race detector multiplies the big-state tests' time and
// memory several times, so their default sizes shrink under it (.ci/run
// runs them again without it at full size).
const raceEnabled = true
