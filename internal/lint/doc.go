// Package lint holds tests over the whole source tree: the import rules of
// docs/architecture.md ("Which package may import which"), checked on every
// non-test Go file; the Go snippets of README.md and docs/architecture.md,
// each of which must quote an example test (func ExampleXxx in a _test.go
// file, compiled by go test); and the test names the documentation cites,
// each of which must exist. It has no code of its own and nothing may import
// it.
package lint
