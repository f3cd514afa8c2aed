package main

import (
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/vlink-dev/vlink/cmd/vlink/internal/base"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// TestRouteNode runs vlink route as a node whose key derives from the
// network key in --key-file, as serve's does: to a node's port it
// connects, and a dial that fails before it has a route says why on the
// route line.
func TestRouteNode(t *testing.T) {
	network := filepath.Join(t.TempDir(), "network.key")
	if code, _, stderr := runSync("key", "--out", network); code != base.ExitOK {
		t.Fatalf("vlink key: exit %d\n%s", code, stderr)
	}
	relay := start(t, "relay", "--listen", "127.0.0.1:0", "--key-file", network)
	relayAddr := relay.stderr.waitFor(t, `msg="relay listening" addr=(\S+)`)
	_, port, _ := net.SplitHostPort(testnet.EchoServer(t))
	web := start(t, "serve", "--listen", "127.0.0.1:0", "--allow", "localhost:"+port,
		"--node", "web", "--relay", relayAddr, "--key-file", network)
	web.stderr.waitFor(t, `msg="serving as a node"`)

	node := []string{"route", "--node", "laptop", "--relay", relayAddr}
	code, stdout, stderr := runSync(append(node, "--key-file", network, "--count", "2", "web.vlink.alt:"+port)...)
	if code != base.ExitOK || !strings.Contains(stdout, "connected in ") {
		t.Errorf("route to web with --key-file: exit %d, stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	// The ladder of paths: laptop takes no connections back, the splice
	// works on loopback, and the second dial leaves out what lost.
	first, second, _ := strings.Cut(stdout, "dial 2 of 2")
	for _, want := range []struct{ in, re string }{
		{first, `(?m)^  reverse +no +- +this node takes no connections back`},
		{first, `(?m)^  splice +yes +\S+ +connected, taken$`},
		{first, `(?m)^  relay +yes +- +not taken: another path came first$`},
		{second, `(?m)^  reverse +no +- +left out: splice won the last dial to web$`},
		{second, `(?m)^  splice +yes +\S+ +connected, taken$`},
	} {
		if !regexp.MustCompile(want.re).MatchString(want.in) {
			t.Errorf("route to web: no line matching %s in\n%s", want.re, want.in)
		}
	}

	code, stdout, stderr = runSync(append(node, "--key-file", network, "nope.vlink.alt:"+port)...)
	if code != base.ExitFailure || !strings.Contains(stdout, "route: none: ") || !strings.Contains(stdout, "no such node") {
		t.Errorf("route to a node that is not there: exit %d (want %d), stdout does not give the reason on the route line:\n%s\nstderr:\n%s",
			code, base.ExitFailure, stdout, stderr)
	}

	code, _, stderr = runSync(append(node, "web.vlink.alt:"+port)...)
	if code != base.ExitUsage || !strings.Contains(stderr, "made with vlink key --node laptop --key-file NETWORK_KEY") {
		t.Errorf("route without a key: exit %d (want %d), stderr does not say how to make the node's key:\n%s", code, base.ExitUsage, stderr)
	}
	code, _, stderr = runSync("route", "--key-file", network, "127.0.0.1:1")
	if code != base.ExitUsage || !strings.Contains(stderr, "--key-file is the network key a node's key derives from") {
		t.Errorf("route --key-file to a host: exit %d (want %d), stderr:\n%s", code, base.ExitUsage, stderr)
	}
}
