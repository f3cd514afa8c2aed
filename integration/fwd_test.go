//go:build linux

package integration

import (
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// chain starts the two nodes of a route, as separate vlink serve
// processes holding one key: gw1 may only carry connections on to gw2,
// gw2 forwards to targets allow matches. It returns them, their
// addresses and the key file.
func chain(t *testing.T, gw2Args ...string) (gw1, gw2 *proc, gw1Addr, gw2Addr, keyFile string) {
	t.Helper()
	keyFile = keyArgs(t, "noise")[1]
	gw2, gw2Addr = startVLink(t, append([]string{"serve", "--key-file", keyFile, "--log-level", "debug"}, gw2Args...)...)
	gw1, gw1Addr = startVLink(t, "serve", "--key-file", keyFile, "--hop", gw2Addr, "--log-level", "debug")
	return gw1, gw2, gw1Addr, gw2Addr, keyFile
}

// originRE reads the origin and the previous hop a node logs for a
// routed connection.
var originRE = regexp.MustCompile(`msg="forwarding a routed connection to (?:the next node|its target)" origin=(\S+) from=(\S+)`)

// TestFwdChain crosses two vlink serve nodes with vlink tunnel --via
// gw1,gw2 --stack zstd, as a user chains gateways: bytes intact both
// ways, zstd end to end (the first node carries compressed bytes), both
// nodes log the origin, a next node a node may not forward to is refused
// naming the node, and the middle node killed mid-stream reaches the
// client as an error.
func TestFwdChain(t *testing.T) {
	for _, stack := range []string{"zstd", "mux+zstd", "parallel:streams=3+lz4"} {
		t.Run("bytes, origin, layers end to end: "+stack, func(t *testing.T) {
			testenv.Programs(t, "socat")
			_, echo := startSocatEcho(t)
			gw1, gw2, gw1Addr, gw2Addr, keyFile := chain(t, "--allow", echo)
			tunnel, tun := startVLink(t, "tunnel", "--via", gw1Addr+","+gw2Addr, "--stack", stack, "--key-file", keyFile, "--to", echo)
			data := genData(16<<20, 3)
			checkEcho(t, tun, data)

			// A multi-link session is several connections, each with its
			// origin: gw2 names one of those gw1 took directly.
			o1 := gw1.WaitFor(t, originRE, startTimeout)
			o2 := gw2.WaitFor(t, originRE, startTimeout)
			if o1[1] != o1[2] || !strings.Contains(gw1.Output(), "origin="+o2[1]+" from="+o2[1]+" ") {
				t.Errorf("the nodes disagree on the origin: gw1 says %s (from %s), gw2 says %s (from %s)", o1[1], o1[2], o2[1], o2[2])
			}
			if o2[2] == o2[1] {
				t.Errorf("gw2 took its previous hop, %s, for the origin", o2[2])
			}
			if strings.Contains(tunnel.Output(), "level=WARN") {
				t.Errorf("the tunnel warned:\n%s", tunnel.Output())
			}
			if stack != "zstd" {
				return // a session outlives the connection: no relay total yet
			}
			// gw1 logs what it relayed when the connection closes.
			up := gw1.WaitFor(t, regexp.MustCompile(`msg="connection closed".* bytes_up=(\d+)`), startTimeout)
			n, _ := strconv.Atoi(up[1])
			// Half the payload is log text: compressed, even in small
			// frames, it leaves well under 15/16 of the payload to carry.
			if n == 0 || n >= len(data)*15/16 {
				t.Errorf("gw1 carried %d bytes of a %d-byte upload, half of it log text: zstd did not run end to end", n, len(data))
			}
		})
	}

	t.Run("refused next node is named", func(t *testing.T) {
		testenv.Programs(t, "socat")
		_, echo := startSocatEcho(t)
		_, _, gw1Addr, _, keyFile := chain(t, "--allow", echo)
		elsewhere := fmt.Sprintf("127.0.0.1:%d", realserver.FreePort(t))
		tunnel, tun := startVLink(t, "tunnel", "--via", gw1Addr+","+elsewhere, "--stack", "zstd", "--key-file", keyFile, "--to", echo)
		got, err := exchange(t, tun, []byte("hello"), 10*time.Second)
		if err == nil || len(got) != 0 {
			t.Fatalf("the client got %q, %v through a refused route; want an error", got, err)
		}
		want := fmt.Sprintf("at hop 1 (%s): target not allowed: forwarding to the next node, %s, is not allowed here", gw1Addr, elsewhere)
		tunnel.WaitFor(t, regexp.MustCompile(regexp.QuoteMeta(want)), startTimeout)
	})

	t.Run("middle node killed mid-download", func(t *testing.T) {
		const size = 32 << 20
		data := genData(size, 4)
		cutDone := make(chan struct{})
		var once sync.Once
		release := func() { once.Do(func() { close(cutDone) }) }
		defer release()
		target := testnet.Listen(t, func(c net.Conn) {
			c.Write(data[:size/2])
			<-cutDone
			c.Write(data[size/2:])
		})
		gw1, _, gw1Addr, gw2Addr, keyFile := chain(t, "--allow", target)
		_, tun := startVLink(t, "tunnel", "--via", gw1Addr+","+gw2Addr, "--stack", "zstd", "--key-file", keyFile, "--to", target)
		c, err := net.Dial("tcp", tun)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(60 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, size/2)); err != nil {
			t.Fatalf("the first half: %v", err)
		}
		gw1.Kill()
		<-gw1.Done()
		release()
		n, err := io.Copy(io.Discard, c)
		checkCut(t, "the client", size/2+n, size, err)
	})
}

// TestFwdProxyProtocol gives nginx, listening with proxy_protocol, the
// origin of a connection that crossed two nodes: nginx answers with the
// address the PROXY v2 header named, which must be the tunnel's, not the
// last node's.
func TestFwdProxyProtocol(t *testing.T) {
	nginx := testenv.Programs(t, "nginx", "curl")[0]
	dir := t.TempDir()
	port := realserver.FreePort(t)
	conf := writeNginxConf(t, dir, "master_process off;\nworker_processes 1;", fmt.Sprintf(`		listen 127.0.0.1:%d proxy_protocol;
		location / { return 200 "$proxy_protocol_addr:$proxy_protocol_port\n"; }`, port))
	p := startProc(t, nginx, "-e", "stderr", "-p", dir, "-c", conf)
	p.Ports = append(p.Ports, port)
	p.WaitListening(t, port)
	web := fmt.Sprintf("127.0.0.1:%d", port)

	_, gw2, gw1Addr, gw2Addr, keyFile := chain(t, "--allow", web, "--proxy-protocol", web)
	_, tun := startVLink(t, "tunnel", "--via", gw1Addr+","+gw2Addr, "--stack", "zstd", "--key-file", keyFile, "--to", web)
	out, stderr, err := run(30*time.Second, nil, "curl", "-sS", "--max-time", "20", "http://"+tun+"/")
	if err != nil {
		t.Fatalf("curl: %v: %s", err, stderr)
	}
	o := gw2.WaitFor(t, originRE, startTimeout)
	if o[1] == o[2] {
		t.Errorf("gw2 took its previous hop, %s, for the origin", o[2])
	}
	if got := strings.TrimSpace(string(out)); got != o[1] {
		t.Errorf("nginx was told the connection came from %q; the origin gw2 logged is %s (its previous hop %s)", got, o[1], o[2])
	}
}
