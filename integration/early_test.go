package integration

import (
	"bytes"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// TestEarlyDataTunnel runs `vlink tunnel --stack zstd+noise` to a `vlink
// serve --identity` in front of socat's echo, through a relay that counts
// flights, with a client that writes its request as it connects, as curl
// does. The first connection learns the gateway's identity the long way
// (8 flights to the answer). While the gateway has been up less than the
// replay window it drops early data, and the tunnel's request goes again
// after the handshake (4, the first flight's). After that the request
// rides the hello and the answer comes back with the gateway's (2, as
// TCP's handshake and request). The echo comes back whole each time, so
// the request reached the target once. A new process with the same pin
// file takes the short way at once (Dialer.PinnedKey).
func TestEarlyDataTunnel(t *testing.T) {
	testenv.Programs(t, "socat")
	dir := t.TempDir()
	keyFile, id := filepath.Join(dir, "vlink.key"), filepath.Join(dir, "gw.identity")
	if err := os.WriteFile(keyFile, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(vlinkBin, "key", "--identity", "--out", id).CombinedOutput(); err != nil {
		t.Fatalf("vlink key --identity: %v: %s", err, out)
	}
	_, echo := startSocatEcho(t)
	serve := startProc(t, vlinkBin, "serve", "--listen", "127.0.0.1:0", "--target", echo, "--key-file", keyFile, "--identity", id, "--grace", "1s")
	serve.Name, serve.CleanExit = "vlink serve", true
	gw := serve.WaitFor(t, listenAddrRE, startTimeout)[1]
	up := time.Now() // a little after the gateway's start
	fr := testnet.NewFlightRecorder(t, gw)
	_, tun := startVLink(t, "tunnel", "--to", fr.Addr, "--stack", "zstd+noise", "--key-file", keyFile,
		"--known-nodes", filepath.Join(dir, "known_nodes"))

	ask := func(i, flights int) {
		t.Helper()
		c, err := net.Dial("tcp", tun)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(startTimeout))
		req := testnet.RandomBytes(1000, uint64(i))
		if _, err := c.Write(req); err != nil {
			t.Fatal(err)
		}
		back := make([]byte, len(req))
		if _, err := io.ReadFull(c, back); err != nil || !bytes.Equal(back, req) {
			t.Fatalf("connection %d: echo intact %v, %v", i, bytes.Equal(back, req), err)
		}
		fl := fr.Flights(i)
		if len(fl) != flights {
			t.Errorf("connection %d: %d flights to the answer, want %d", i, len(fl), flights)
			for j, f := range fl {
				t.Logf("flight %d: up %v, %d bytes", j, f.Up, len(f.Bytes))
			}
		}
	}
	ask(0, 8)
	if time.Since(up) < 8*time.Second {
		ask(1, 4)
	} else {
		t.Log("the machine is slow: the gateway's replay window passed before the second connection")
		ask(1, 2)
	}
	time.Sleep(time.Until(up.Add(11 * time.Second)))
	ask(2, 2)
	ask(3, 2)

	// A new process with the tunnel's pin file (vlink connect, one
	// connection each, as ssh's ProxyCommand) names the pinned key in
	// its first flight, so the gateway takes it: its first answer is the
	// accept, not a challenge. It has not learnt that the gateway takes
	// early data, which a process learns from an answer.
	req := testnet.RandomBytes(1000, 9)
	out, stderr, err := run(startTimeout, bytes.NewReader(req), vlinkBin, "connect", "--stack", "zstd+noise", "--key-file", keyFile,
		"--known-nodes", filepath.Join(dir, "known_nodes"), fr.Addr)
	if err != nil || !bytes.Equal(out, req) {
		t.Fatalf("vlink connect: echo intact %v, %v: %s", bytes.Equal(out, req), err, stderr)
	}
	if fl := fr.Flights(4); len(fl) < 2 || len(fl[1].Bytes) < 2 || fl[1].Bytes[1] != 4 {
		t.Fatalf("vlink connect's connection: %d flights; want the gateway's accept (message type 4) to answer the first", len(fl))
	}
}
