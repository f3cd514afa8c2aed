package integration

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// TestMembersThroughRelay runs a vlink network with an owner, made with
// the commands the README teaches (vlink owner, vlink key --identity,
// vlink cert sign), as real processes: a relay holding a relay's
// certificate, a server node db and a tunnel node laptop holding theirs.
// No key is shared: the relay's wire (recorded by a forwarder in front of
// it, which the nodes take for the relay) carries none of a relayed
// echo's payload, and db knows laptop by its certificate. A node cannot
// claim a name its certificate does not give it, a certificate of
// another owner is refused, and a revoked node is dropped and refused
// after one SIGHUP.
func TestMembersThroughRelay(t *testing.T) {
	testenv.Programs(t, "socat")
	dir := t.TempDir()
	file := func(name string) string { return filepath.Join(dir, name) }
	vlinkOK := func(args ...string) string { t.Helper(); return vlinkOut(t, args...) }
	vlinkOK("owner", "init", "--out", file("owner.key"))
	vlinkOK("owner", "init", "--out", file("other-owner.key"))
	member := func(owner, name string, relay bool) { signMember(t, dir, owner, name, relay) }
	member("owner.key", "relay", true)
	member("owner.key", "db", false)
	member("owner.key", "laptop", false)
	member("owner.key", "mallory", false)
	member("owner.key", "runner", false)
	member("owner.key", "guest", false)
	rules := file("rules.toml")
	if err := os.WriteFile(rules, []byte("[[allow]]\nfrom = \"laptop\"\nto = \"db\"\nports = \"*\"\n\n[[allow]]\nfrom = \"runner\"\nto = \"db\"\nports = \"*\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	member("other-owner.key", "stranger", false)
	revoked := file("revoked")
	vlinkOK("cert", "revoke", "--revocations", revoked, file("mallory.crt"))
	certFlags := func(name string) []string {
		return []string{"--cert", file(name + ".crt"), "--cert-key", file(name + ".key"), "--owner", file("owner.key.pub"), "--revocations", revoked}
	}

	relay, relayAddr := startVLink(t, append([]string{"relay", "--log-level", "debug"}, certFlags("relay")...)...)
	relay.WaitFor(t, regexp.MustCompile(`msg="relay listening" .*cert=relay`), startTimeout)
	tap, recorded := recordingForwarder(t, "127.0.0.1", relayAddr)
	_, echo := startSocatEcho(t)
	_, echoPort, _ := net.SplitHostPort(echo)

	serve := startProc(t, vlinkBin, append([]string{"serve", "--listen", "127.0.0.1:0", "--grace", "1s", "--log-level", "debug",
		"--relay", tap, "--allow", "localhost:" + echoPort, "--rules", rules}, certFlags("db")...)...)
	serve.Name, serve.CleanExit = "vlink serve", true
	serve.Ports = append(serve.Ports, realserver.Port(t, serve.WaitFor(t, listenAddrRE, startTimeout)[1]))
	serve.WaitFor(t, regexp.MustCompile(`msg="serving as a node" node=db`), startTimeout)

	tunnel, tun := startVLink(t, append([]string{"tunnel", "--to", "db.vlink.alt:" + echoPort, "--stack", "zstd+relay", "--relay", tap}, certFlags("laptop")...)...)
	marker := []byte("the payload of laptop, which the relay never reads; ")
	data := append(bytes.Repeat(marker, (2<<20)/len(marker)), testnet.RandomBytes(1<<20, 21)...)
	checkEcho(t, tun, data)
	serve.WaitFor(t, regexp.MustCompile(`msg="vlink: accepted" .*stack=zstd\+noise target=localhost:`+echoPort+` node=laptop`), startTimeout)
	serve.WaitFor(t, regexp.MustCompile(`msg="control: connection from a node" from=laptop port=`+echoPort+` path=relay`), startTimeout)
	if bytes.Contains(recorded(), marker[:32]) {
		t.Fatal("the relay's wire carries laptop's payload in clear")
	}

	t.Run("exec", func(t *testing.T) {
		// An unmodified program reaches db by name, as the member runner
		// (as laptop, it would take laptop's registration from the tunnel).
		data := testnet.RandomBytes(1<<20, 22)
		out, stderr, err := run(time.Minute, bytes.NewReader(data), vlinkBin, append(append([]string{"exec", "--log-level", "debug", "--relay", tap},
			certFlags("runner")...), "--", "socat", "-t", "5", "-", "TCP:db.vlink.alt:"+echoPort)...)
		if err != nil || testnet.Sum(out) != testnet.Sum(data) {
			t.Fatalf("socat under vlink exec: %v, %d of %d bytes back\n%s", err, len(out), len(data), stderr)
		}
		serve.WaitFor(t, regexp.MustCompile(`msg="vlink: accepted" .*stack=noise target=localhost:`+echoPort+` node=runner`), startTimeout)
	})
	t.Run("rules", func(t *testing.T) {
		// guest is a member, but db's rules let only laptop and runner in.
		tunnel, guest := startVLink(t, append([]string{"tunnel", "--to", "db.vlink.alt:" + echoPort, "--relay", tap}, certFlags("guest")...)...)
		if got, err := exchange(t, guest, []byte("hello"), startTimeout); err == nil && len(got) != 0 {
			t.Fatalf("db answered guest %q", got)
		}
		tunnel.WaitFor(t, regexp.MustCompile(`the network's rules do not let guest reach db on port `+echoPort), startTimeout)
	})
	t.Run("no relay", func(t *testing.T) {
		_, stderr, err := run(startTimeout, nil, vlinkBin, append([]string{"tunnel", "--listen", "127.0.0.1:0", "--to", "db.vlink.alt:" + echoPort}, certFlags("laptop")...)...)
		if err == nil || !strings.Contains(stderr, "give the network's relay too (--relay HOST:PORT)") {
			t.Fatalf("a member tunnel without --relay: %v\n%s", err, stderr)
		}
	})
	t.Run("a name the certificate does not give", func(t *testing.T) {
		_, stderr, err := run(startTimeout, nil, vlinkBin, append([]string{"tunnel", "--listen", "127.0.0.1:0", "--to", "db.vlink.alt:" + echoPort,
			"--node", "db", "--relay", tap}, certFlags("laptop")...)...)
		if err == nil || !regexp.MustCompile(`certificate in .* names the node laptop`).MatchString(stderr) {
			t.Fatalf("a tunnel claiming db with laptop's certificate: %v\n%s", err, stderr)
		}
	})
	t.Run("another owner's certificate", func(t *testing.T) {
		_, stderr, err := run(startTimeout, nil, vlinkBin, "tunnel", "--listen", "127.0.0.1:0", "--to", "db.vlink.alt:"+echoPort, "--relay", tap,
			"--cert", file("stranger.crt"), "--cert-key", file("stranger.key"), "--owner", file("other-owner.key.pub"))
		if err == nil || !regexp.MustCompile(`not a relay of this network|certificate refused|not issued`).MatchString(stderr) {
			t.Fatalf("a node of another owner: %v\n%s", err, stderr)
		}
	})
	t.Run("revoked at the node", func(t *testing.T) {
		// db's list is reread on SIGHUP; the relay's is not, so runner
		// still registers, and db alone refuses it.
		vlinkOK("cert", "revoke", "--revocations", revoked, file("runner.crt"))
		serve.Cmd.Process.Signal(syscall.SIGHUP)
		serve.WaitFor(t, regexp.MustCompile(`msg="revocation list reloaded" .*revoked=2`), startTimeout)
		// runner holds no list that names it (its own copy is older).
		runner := []string{"--cert", file("runner.crt"), "--cert-key", file("runner.key"), "--owner", file("owner.key.pub")}
		out, stderr, err := run(time.Minute, bytes.NewReader([]byte("hello")), vlinkBin, append(append([]string{"exec", "--relay", tap},
			runner...), "--", "socat", "-t", "5", "-", "TCP:db.vlink.alt:"+echoPort)...)
		if err == nil || len(out) != 0 {
			t.Fatalf("db answered runner after revoking it: %v, %q\n%s", err, out, stderr)
		}
		serve.WaitFor(t, regexp.MustCompile(`runner.*revoked`), startTimeout)
	})
	t.Run("revoked", func(t *testing.T) {
		_, stderr, err := run(startTimeout, nil, vlinkBin, append([]string{"tunnel", "--listen", "127.0.0.1:0", "--to", "db.vlink.alt:" + echoPort,
			"--relay", tap}, certFlags("mallory")...)...)
		if err == nil || !regexp.MustCompile(`revoked`).MatchString(stderr) {
			t.Fatalf("a revoked node: %v\n%s", err, stderr)
		}
		// Revoke laptop, which is registered: one SIGHUP drops it, and
		// it cannot come back.
		vlinkOK("cert", "revoke", "--revocations", revoked, file("laptop.crt"))
		relay.Cmd.Process.Signal(syscall.SIGHUP)
		relay.WaitFor(t, regexp.MustCompile(`msg="relay: revocation list reloaded" .*revoked=3 dropped=1`), startTimeout)
		tunnel.WaitFor(t, regexp.MustCompile(`revoked`), startTimeout)
	})
}

// vlinkOut runs vlink with args and returns its output, trimmed; a
// failure fails the test.
func vlinkOut(t *testing.T, args ...string) string {
	t.Helper()
	out, stderr, err := run(startTimeout, nil, vlinkBin, args...)
	if err != nil {
		t.Fatalf("vlink %v: %v\n%s", args, err, stderr)
	}
	return string(bytes.TrimSpace(out))
}

// signMember makes name's own key in dir (name.key), as the machine
// would, and has the owner in dir's file owner sign it into name.crt, a
// relay's certificate if relay.
func signMember(t *testing.T, dir, owner, name string, relay bool) {
	t.Helper()
	file := func(name string) string { return filepath.Join(dir, name) }
	vlinkOut(t, "key", "--identity", "--out", file(name+".key"))
	args := []string{"cert", "sign", "--owner", file(owner), "--name", name, "--pub", vlinkOut(t, "key", "--pub", file(name+".key")), "--out", file(name + ".crt")}
	if relay {
		args = append(args, "--relay")
	}
	vlinkOut(t, args...)
}
