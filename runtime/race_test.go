//go:build race

package runtime

// raceEnabled: the race detector multiplies memory several times: a test
// of peak RSS measures it, not the code (.ci/run runs such tests again
// without it).
const raceEnabled = true
