package integration

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// TestRelaysFormOneNetwork runs two `vlink relay` processes of one owner,
// linked by --peer, with db registered at relay-2 and laptop at relay-1:
// laptop's tunnel reaches db through both relays, the bytes intact both
// ways, and the wire between the relays (a recording forwarder in front
// of relay-1, which relay-2 takes for it) carries none of them in clear.
// Then relay-2 is killed mid-transfer: the tunnel's client sees an
// error, never a clean end, and a new connection goes through relay-1
// within 2 s.
func TestRelaysFormOneNetwork(t *testing.T) {
	testenv.Programs(t, "socat")
	dir := t.TempDir()
	file := func(name string) string { return filepath.Join(dir, name) }
	vlinkOut(t, "owner", "init", "--out", file("owner.key"))
	for _, m := range []struct {
		name  string
		relay bool
	}{{"relay-1", true}, {"relay-2", true}, {"db", false}, {"laptop", false}} {
		signMember(t, dir, "owner.key", m.name, m.relay)
	}
	certFlags := func(name string) []string {
		return []string{"--cert", file(name + ".crt"), "--cert-key", file(name + ".key"), "--owner", file("owner.key.pub")}
	}

	relay1, r1 := startVLink(t, append([]string{"relay", "--log-level", "debug"}, certFlags("relay-1")...)...)
	between, recorded := recordingForwarder(t, "127.0.0.1", r1)
	relay2, r2 := startVLink(t, append([]string{"relay", "--log-level", "debug", "--peer", between}, certFlags("relay-2")...)...)
	relay1.WaitFor(t, regexp.MustCompile(`msg="control: relay: linked with another relay" relay=relay-2`), startTimeout)
	relay2.WaitFor(t, regexp.MustCompile(`msg="control: relay: linked with another relay" relay=relay-1`), startTimeout)

	_, echo := startSocatEcho(t)
	_, echoPort, _ := net.SplitHostPort(echo)
	serve := startProc(t, vlinkBin, append([]string{"serve", "--listen", "127.0.0.1:0", "--grace", "1s", "--log-level", "debug",
		"--relay", r2 + "," + r1, "--allow", "localhost:" + echoPort}, certFlags("db")...)...)
	serve.Name, serve.CleanExit = "vlink serve", true
	serve.Ports = append(serve.Ports, realserver.Port(t, serve.WaitFor(t, listenAddrRE, startTimeout)[1]))
	serve.WaitFor(t, regexp.MustCompile(`msg="control: registered" node=db relay=`+regexp.QuoteMeta(r2)), startTimeout)
	_, tun := startVLink(t, append([]string{"tunnel", "--to", "db.vlink.alt:" + echoPort, "--stack", "zstd+relay", "--relay", r1 + "," + r2}, certFlags("laptop")...)...)
	relay2.WaitFor(t, regexp.MustCompile(`msg="control: relay: registered" node=db`), startTimeout)

	marker := []byte("laptop's payload, which neither relay reads; ")
	data := append(bytes.Repeat(marker, (2<<20)/len(marker)), testnet.RandomBytes(1<<20, 37)...)
	checkEcho(t, tun, data)
	serve.WaitFor(t, regexp.MustCompile(`msg="control: connection from a node" from=laptop port=`+echoPort+` path=relay`), startTimeout)
	relay2.WaitFor(t, regexp.MustCompile(`msg="control: relay: relayed through another relay" node=db relay=relay-1`), startTimeout)
	if bytes.Contains(recorded(), marker[:32]) {
		t.Fatal("the wire between the relays carries laptop's payload in clear")
	}

	// relay-2 dies mid-transfer.
	c, err := net.Dial("tcp", tun)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		chunk := testnet.RandomBytes(64<<10, 38)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	}()
	c.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := io.CopyN(io.Discard, c, 4<<20); err != nil {
		t.Fatalf("the echo before relay-2 dies: %v", err)
	}
	// The kernel hands a reset to one call only: the reader alone must
	// see it. The client never ended its stream, so any end is an abort.
	close(stop)
	<-stopped
	relay2.Kill()
	<-relay2.Done()
	killed := time.Now()
	// The connection through the dead relay ends in an error, and new
	// ones work through relay-1, each on its own time.
	ended := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, c)
		ended <- err
	}()
	for {
		got, err := exchange(t, tun, marker, 5*time.Second)
		if err == nil && bytes.Equal(got, marker) {
			break
		}
		if time.Since(killed) > 15*time.Second {
			t.Fatalf("no echo through relay-1 15 s after relay-2 was killed: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(killed)
	t.Logf("a new connection went through relay-1 %v after relay-2 was killed", took.Round(time.Millisecond))
	err = <-ended
	switch {
	case err == nil:
		t.Fatal("the tunnel's client saw a clean end after relay-2 was killed: a silent short stream")
	case errors.Is(err, os.ErrDeadlineExceeded):
		t.Fatal("the tunnel's client saw nothing for a minute after relay-2 was killed")
	}
	t.Logf("the client's read after relay-2 was killed: %v (%v)", err, time.Since(killed).Round(time.Millisecond))
	serve.WaitFor(t, regexp.MustCompile(`msg="control: registered" node=db relay=`+regexp.QuoteMeta(r1)), startTimeout)
	if took > 2*time.Second {
		t.Errorf("a new connection took %v after relay-2 died, want at most 2 s", took)
	}
}
