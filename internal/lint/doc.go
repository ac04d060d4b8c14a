// Package lint holds tests over the whole source tree: the import rules of
// docs/architecture.md ("Which package may import which"), checked on every
// non-test Go file. It has no code of its own and nothing may import it.
package lint
