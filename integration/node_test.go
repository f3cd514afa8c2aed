//go:build linux

package integration

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// TestNodeThroughRelay runs a vlink network of real processes: a relay,
// a server node "db" exposing a socat echo server's port, and a tunnel
// node "laptop" reaching db.vlink.alt:PORT by name. The bytes come back
// intact; db's serve logs who dialed (laptop, proven by its key) and
// the stack (zstd, over the noise layer the dialer added since the relay
// carries the bytes: stack zstd+relay); a tunnel that accepts reverse
// connections is connected back to by db instead; one with no path in
// its stack gets a spliced connection (nothing filters on loopback, so
// the splice, tried before the relay, works); a port db does not expose is refused
// with db's reason; a node with another node's key is refused by the
// relay.
func TestNodeThroughRelay(t *testing.T) {
	testenv.Programs(t, "socat", "cc")
	dir := t.TempDir()
	networkKey, dbKey, laptopKey := networkKeys(t, dir)
	relay, relayAddr := startVLink(t, "relay", "--key-file", networkKey, "--metrics", "127.0.0.1:0")
	relayMetrics := relay.WaitFor(t, metricsAddrRE, startTimeout)[1]
	_, echo := startSocatEcho(t)
	_, echoPort, _ := net.SplitHostPort(echo)
	// A service bound to the IPv6 loopback only is localhost too.
	echo6Port := strconv.Itoa(realserver.FreePort(t))
	echo6 := startProc(t, "socat", "TCP6-LISTEN:"+echo6Port+",bind=[::1],reuseaddr,fork", "EXEC:cat")
	echo6.WaitListening(t, realserver.Port(t, "[::1]:"+echo6Port))

	serve := startProc(t, vlinkBin, "serve", "--listen", "127.0.0.1:0", "--grace", "1s", "--log-level", "debug",
		"--node", "db", "--relay", relayAddr, "--node-key-file", dbKey, "--allow", "localhost:"+echoPort, "--allow", "localhost:"+echo6Port)
	serve.Name, serve.CleanExit = "vlink serve", true
	serve.Ports = append(serve.Ports, realserver.Port(t, serve.WaitFor(t, listenAddrRE, startTimeout)[1]))
	serve.WaitFor(t, regexp.MustCompile(`msg="serving as a node" node=db`), startTimeout)
	relay.WaitFor(t, regexp.MustCompile(`msg="control: relay: registered" node=db`), startTimeout)

	first, tun := startVLink(t, "tunnel", "--to", "db.vlink.alt:"+echoPort, "--stack", "zstd+relay",
		"--node", "laptop", "--relay", relayAddr, "--node-key-file", laptopKey)
	checkEcho(t, tun, testnet.RandomBytes(4<<20, 11))
	serve.WaitFor(t, regexp.MustCompile(`msg="control: connection from a node" from=laptop port=`+echoPort+` path=relay`), startTimeout)
	// The relay's metrics: two nodes, and the connection it carried,
	// its bytes both ways (the echo's 4 MiB each way, with the noise
	// layer's framing on top) once it ended.
	testnet.WaitMetrics(t, "relay", "http://"+relayMetrics+"/metrics", map[string]float64{"vlink_relay_nodes": 2, "vlink_relay_connections_total": 1,
		"vlink_relay_connections_open": 0, `vlink_relay_refusals_total{reason="no such node"}`: 0})
	if b := testnet.ScrapeMetrics(t, "http://"+relayMetrics+"/metrics")["vlink_relay_bytes_total"]; b < 8<<20 || b > 8.2*(1<<20) {
		t.Errorf("vlink_relay_bytes_total = %v, want the 8 MiB of the echo, framing included", b)
	}
	serve.WaitFor(t, regexp.MustCompile(`msg="vlink: accepted" .*stack=zstd\+noise target=localhost:`+echoPort+` node=laptop`), startTimeout)
	// Each subtest's tunnel is node laptop too, and two holders of one
	// name push each other off the relay in turn (the newer registration
	// wins; the other comes back within a second): one laptop at a time.
	first.Stop(t)

	t.Run("localhost on IPv6", func(t *testing.T) {
		_, tun6 := startVLink(t, "tunnel", "--to", "db.vlink.alt:"+echo6Port, "--stack", "zstd",
			"--node", "laptop", "--relay", relayAddr, "--node-key-file", laptopKey)
		checkEcho(t, tun6, testnet.RandomBytes(1<<20, 16))
	})

	t.Run("splice", func(t *testing.T) {
		_, sp := startVLink(t, "tunnel", "--to", "db.vlink.alt:"+echoPort, "--stack", "zstd",
			"--node", "laptop", "--relay", relayAddr, "--node-key-file", laptopKey)
		checkEcho(t, sp, testnet.RandomBytes(1<<20, 14))
		serve.WaitFor(t, regexp.MustCompile(`msg="control: connection from a node" from=laptop port=`+echoPort+` path=splice`), startTimeout)
	})

	t.Run("reverse", func(t *testing.T) {
		// The dialer accepts connections back: db connects to it, and
		// the relay carries nothing.
		_, rev := startVLink(t, "tunnel", "--to", "db.vlink.alt:"+echoPort, "--stack", "lz4",
			"--node", "laptop", "--relay", relayAddr, "--node-key-file", laptopKey, "--reverse-listen", "127.0.0.1:0")
		checkEcho(t, rev, testnet.RandomBytes(1<<20, 12))
		serve.WaitFor(t, regexp.MustCompile(`msg="control: connection from a node" from=laptop port=`+echoPort+` path=reverse`), startTimeout)
		serve.WaitFor(t, regexp.MustCompile(`msg="vlink: accepted" .*stack=lz4\+noise target=localhost:`+echoPort+` node=laptop`), startTimeout)
	})
	t.Run("exec", func(t *testing.T) {
		// An unmodified program (socat) connects to db.vlink.alt:PORT
		// under vlink exec: its name never reaches the DNS, the
		// connection goes through the network.
		data := testnet.RandomBytes(1<<20, 13)
		out, stderr, err := run(time.Minute, bytes.NewReader(data), vlinkBin, "exec", "--log-level", "debug",
			"--node", "laptop", "--relay", relayAddr, "--node-key-file", laptopKey,
			"--", "socat", "-t", "5", "-", "TCP:db.vlink.alt:"+echoPort)
		if err != nil || testnet.Sum(out) != testnet.Sum(data) {
			t.Fatalf("socat under vlink exec: %v, %d of %d bytes back\n%s", err, len(out), len(data), stderr)
		}
		serve.WaitFor(t, regexp.MustCompile(`msg="vlink: accepted" .*stack=noise target=localhost:`+echoPort+` node=laptop`), startTimeout)
	})
	t.Run("socks", func(t *testing.T) {
		// A SOCKS4a client names db.vlink.alt; vlink socks reaches it
		// through the network.
		_, socks := startVLink(t, "socks", "--node", "laptop", "--relay", relayAddr, "--node-key-file", laptopKey)
		sh, sp, _ := net.SplitHostPort(socks)
		data := testnet.RandomBytes(1<<20, 14)
		out, stderr, err := run(time.Minute, bytes.NewReader(data), "socat", "-t", "5", "-",
			"SOCKS4A:"+sh+":db.vlink.alt:"+echoPort+",socksport="+sp)
		if err != nil || testnet.Sum(out) != testnet.Sum(data) {
			t.Fatalf("socat through vlink socks: %v, %d of %d bytes back\n%s", err, len(out), len(data), stderr)
		}
	})
	t.Run("port not exposed", func(t *testing.T) {
		tunnel, closed := startVLink(t, "tunnel", "--to", "db.vlink.alt:1", "--stack", "zstd",
			"--node", "laptop", "--relay", relayAddr, "--node-key-file", laptopKey)
		if got, err := exchange(t, closed, []byte("hello"), startTimeout); err == nil && len(got) != 0 {
			t.Fatalf("a port db does not expose answered %q", got)
		}
		tunnel.WaitFor(t, regexp.MustCompile(`forwarding to localhost:1 is not allowed here`), startTimeout)
	})
	t.Run("no such node", func(t *testing.T) {
		tunnel, ghost := startVLink(t, "tunnel", "--to", "ghost.vlink.alt:"+echoPort, "--stack", "zstd",
			"--node", "laptop", "--relay", relayAddr, "--node-key-file", laptopKey)
		if got, err := exchange(t, ghost, []byte("hello"), startTimeout); err == nil && len(got) != 0 {
			t.Fatalf("a node nobody runs answered %q", got)
		}
		tunnel.WaitFor(t, regexp.MustCompile(`msg="cannot reach destination"`), startTimeout)
		testnet.WaitMetrics(t, "relay", "http://"+relayMetrics+"/metrics", map[string]float64{`vlink_relay_refusals_total{reason="no such node"}`: 1})
	})
	t.Run("another node's key", func(t *testing.T) {
		_, stderr, err := run(startTimeout, nil, vlinkBin, "tunnel", "--listen", "127.0.0.1:0", "--to", "db.vlink.alt:"+echoPort,
			"--node", "db", "--relay", relayAddr, "--node-key-file", laptopKey)
		if err == nil || !regexp.MustCompile(`refused`).MatchString(stderr) {
			t.Fatalf("a tunnel posing as db with laptop's key: %v\n%s", err, stderr)
		}
		relay.WaitFor(t, regexp.MustCompile(`msg="vlink: refused" remote=127\.0\.0\.1:\d+ code="authentication failed"`), startTimeout)
		testnet.WaitMetrics(t, "relay", "http://"+relayMetrics+"/metrics", map[string]float64{`vlink_relay_failed_logins_total{reason="authentication_failed"}`: 1})
	})
}

// TestNodeRelayThroughProxy: a node that gets out only through a proxy
// joins the network: vlink serve --node reaches the relay through dante,
// named by --relay-stack, or by the configuration's route for the
// relay's address; the proxy's wire carries the control connection (the
// recording forwarder in front of dante saw it), and a tunnel node
// reaches the served port by name.
func TestNodeRelayThroughProxy(t *testing.T) {
	testenv.Programs(t, "socat", "danted")
	dir := t.TempDir()
	networkKey, dbKey, laptopKey := networkKeys(t, dir)
	_, relayAddr := startVLink(t, "relay", "--key-file", networkKey)
	_, echo := startSocatEcho(t)
	_, echoPort, _ := net.SplitHostPort(echo)
	dante := realserver.StartDante(t, false)
	host := hostIPv4(t)
	_, relayPort, _ := net.SplitHostPort(relayAddr)
	config := filepath.Join(dir, "config.toml")

	for _, tc := range []struct {
		name string
		args func(proxy string) []string
	}{
		{"--relay-stack", func(proxy string) []string { return []string{"--relay-stack", "socks5:addr=" + proxy} }},
		{"configuration", func(proxy string) []string {
			route := fmt.Sprintf("[[route]]\nhost = \"127.0.0.1\"\nports = \"%s\"\nstack = \"socks5h://%s\"\n", relayPort, proxy)
			if err := os.WriteFile(config, []byte(route), 0o600); err != nil {
				t.Fatal(err)
			}
			t.Setenv("VLINK_CONFIG", config) // the child processes' configuration
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proxy, wire := recordingForwarder(t, host, dante.Addr)
			args := append([]string{"serve", "--listen", "127.0.0.1:0", "--grace", "1s",
				"--node", "db", "--relay", relayAddr, "--node-key-file", dbKey, "--allow", "localhost:" + echoPort}, tc.args(proxy)...)
			serve := startProc(t, vlinkBin, args...)
			serve.Name, serve.CleanExit = "vlink serve", true
			serve.Ports = append(serve.Ports, realserver.Port(t, serve.WaitFor(t, listenAddrRE, startTimeout)[1]))
			serve.WaitFor(t, regexp.MustCompile(`msg="reaching the relay through a stack" stack="noise\+socks5`), startTimeout)
			serve.WaitFor(t, regexp.MustCompile(`msg="serving as a node" node=db`), startTimeout)
			if len(wire()) == 0 {
				t.Fatal("the control connection did not cross the proxy")
			}
			_, tun := startVLink(t, "tunnel", "--to", "db.vlink.alt:"+echoPort, "--stack", "zstd+relay",
				"--node", "laptop", "--relay", relayAddr, "--node-key-file", laptopKey)
			checkEcho(t, tun, testnet.RandomBytes(1<<20, 17))
			serve.Stop(t)
		})
	}
}

// networkKeys makes, with vlink key, a network key and the node keys of
// db and laptop in dir.
func networkKeys(t *testing.T, dir string) (network, db, laptop string) {
	t.Helper()
	network, db, laptop = filepath.Join(dir, "network.key"), filepath.Join(dir, "db.key"), filepath.Join(dir, "laptop.key")
	for _, args := range [][]string{
		{"key", "--out", network},
		{"key", "--node", "db", "--key-file", network, "--out", db},
		{"key", "--node", "laptop", "--key-file", network, "--out", laptop},
	} {
		if _, stderr, err := run(startTimeout, nil, vlinkBin, args...); err != nil {
			t.Fatalf("vlink %v: %v\n%s", args, err, stderr)
		}
	}
	return network, db, laptop
}
