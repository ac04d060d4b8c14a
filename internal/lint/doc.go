// Package lint holds tests over the whole source tree: the import rules of
// docs/architecture.md ("Which package may import which"), checked on every
// non-test Go file; the Go snippets of README.md and of every .md file
// under docs/, each of which must quote an example test (func ExampleXxx in
// a _test.go file, compiled by go test); the test names that documentation
// cites, each of which must exist; its relative links, each of which must
// reach a file of the module (and, with #anchor, a heading of it); and the
// metrics reference, which must list every metric the code registers and no
// other. It has no code of its own and nothing may import it.
package lint
