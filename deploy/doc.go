// Package deploy holds Weir's deployment artifacts and their tests: the Helm
// chart (helm/weir) and the container image definition (Dockerfile). The tests
// lint and render the chart with Helm's Go SDK, decode every rendered object
// strictly against the Kubernetes API types, and check that every streamctl
// argument the chart passes is a flag the binary accepts. Offline: nothing is
// deployed and no cluster is needed.
//
// It is a module of its own so Helm's and Kubernetes' dependencies stay out of
// Weir's go.mod; it must not be imported by Weir's packages.
package deploy
