// Package integration holds vlink's black-box tests and end-to-end
// benchmarks: they build the vlink command, run it as real processes on
// 127.0.0.1 next to unmodified programs (curl, python3's http.server,
// socat, iperf3) and check what those programs see: the bytes they
// deliver and their SHA-256, the refusals, the survival of a server fed
// bad input.
//
// The package has no API; everything is in its tests. A missing program
// skips a test with the reason, except in CI (CI=true) where it fails.
// deps.sh installs the programs; bench/README.md describes the
// benchmarks. Subpackage lab is the WAN lab: hosts in network namespaces
// joined by emulated long-distance links.
package integration
