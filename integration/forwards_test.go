//go:build linux

package integration

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/procnet"
	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// notifySocket listens where a service started by systemd with
// Type=notify sends its state, and collects the datagrams.
type notifySocket struct {
	path string
	got  chan string
}

func newNotifySocket(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	n := &notifySocket{path: path, got: make(chan string, 64)}
	go func() {
		buf := make([]byte, 4096)
		for {
			k, err := c.Read(buf)
			if err != nil {
				return
			}
			n.got <- string(buf[:k])
		}
	}()
	return n
}

// expect waits for the next datagram and checks it matches re.
func (n *notifySocket) expect(t *testing.T, re string) {
	t.Helper()
	select {
	case d := <-n.got:
		if !regexp.MustCompile(re).MatchString(d) {
			t.Fatalf("systemd was told %q, want a match for %q", d, re)
		}
	case <-time.After(startTimeout):
		t.Fatalf("systemd was told nothing within %v, want %q", startTimeout, re)
	}
}

// reload sends p SIGHUP and waits for the n-th reload's outcome line.
func reload(t *testing.T, p *proc, n int) {
	t.Helper()
	if err := p.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitCount(t, p, regexp.MustCompile(`msg=(?:reloaded|"reload refused|"reload incomplete)`), n, startTimeout)
}

// openEcho opens a connection to addr and checks that it echoes.
func openEcho(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, startTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	roundTrip(t, c, genData(50000, 1))
	return c
}

// roundTrip sends data on c and checks that it comes back intact.
func roundTrip(t *testing.T, c net.Conn, data []byte) {
	t.Helper()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	defer c.SetDeadline(time.Time{})
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		werr <- err
	}()
	got := make([]byte, len(data))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("echo through %s: %v", c.RemoteAddr(), err)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if testnet.Sum(got) != testnet.Sum(data) {
		t.Fatalf("echo through %s: the bytes differ", c.RemoteAddr())
	}
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestForwardsReload runs a gateway and a tunnel of two forwards each
// from --forwards files, as systemd would (Type=notify), and reloads
// them: an unchanged forward keeps its open connection through every
// reload; a removed one stops accepting at once, and its open connection
// works until --grace ends, then is reset, never ended cleanly; a changed
// one restarts on its port; a bad file, or a port someone else holds, is
// refused with the reason and the running set stays as it was.
func TestForwardsReload(t *testing.T) {
	testenv.Programs(t, "socat")
	_, echo1 := startSocatEcho(t)
	_, echo2 := startSocatEcho(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "vlink.key"), "forwards-test-key-0123456789abcdef\n")
	ports := map[string]string{}
	for _, n := range []string{"S1", "S2", "T1", "T2", "T3", "T4"} {
		ports[n] = fmt.Sprintf("127.0.0.1:%d", realserver.FreePort(t))
	}
	expand := func(s string) string {
		for k, v := range ports {
			s = strings.ReplaceAll(s, "@"+k, v)
		}
		return strings.NewReplacer("@E1", echo1, "@E2", echo2).Replace(s)
	}

	// The gateway: two forwards, the key file relative to the file.
	serveFile := filepath.Join(dir, "serve.toml")
	serveText := `
[[forward]]
name = "one"
listen = "@S1"
target = "@E1"
key_file = "vlink.key"

[[forward]]
name = "two"
listen = "@S2"
target = "@E2"
key_file = "vlink.key"
layers = "zstd"
`
	writeFile(t, serveFile, expand(serveText))
	sn := newNotifySocket(t)
	t.Setenv("NOTIFY_SOCKET", sn.path)
	serve := startProc(t, vlinkBin, "serve", "--forwards", serveFile, "--grace", "1s")
	serve.Name, serve.CleanExit = "vlink serve", true
	serve.WaitFor(t, regexp.MustCompile(`msg="running forwards" file=\S+ count=2`), startTimeout)
	sn.expect(t, `^READY=1\nSTATUS=2 forwards running from \S+serve.toml\n$`)

	tunnelFile := filepath.Join(dir, "tunnel.toml")
	tunnelText := `
[[forward]]
name = "kept"
listen = "@T1"
to = "@S1"
stack = "zstd"
key_file = "vlink.key"

[[forward]]
name = "removed"
listen = "@T2"
to = "@S1"
stack = "lz4"
key_file = "vlink.key"
`
	writeFile(t, tunnelFile, expand(tunnelText))
	tn := newNotifySocket(t)
	t.Setenv("NOTIFY_SOCKET", tn.path)
	tunnel := startProc(t, vlinkBin, "tunnel", "--forwards", tunnelFile, "--grace", "2s")
	tunnel.Name, tunnel.CleanExit = "vlink tunnel", true
	tunnel.WaitFor(t, regexp.MustCompile(`msg="running forwards" file=\S+ count=2`), startTimeout)
	tn.expect(t, `^READY=1\nSTATUS=2 forwards running`)

	kept := openEcho(t, ports["T1"])
	removed := openEcho(t, ports["T2"])

	// 1. The tunnel drops "removed" and adds "added", which reaches the
	// gateway's "two"; the gateway changes "two" (lz4 now), on its port.
	writeFile(t, tunnelFile, expand(strings.Replace(tunnelText, `name = "removed"
listen = "@T2"
to = "@S1"`, `name = "added"
listen = "@T3"
to = "@S2"`, 1)))
	writeFile(t, serveFile, expand(strings.Replace(serveText, `layers = "zstd"`, `layers = "lz4"`, 1)))
	reload(t, serve, 1)
	sn.expect(t, `^RELOADING=1\nMONOTONIC_USEC=[1-9][0-9]*\n$`)
	sn.expect(t, `^READY=1\nSTATUS=2 forwards running`)
	if !strings.Contains(serve.Output(), "msg=reloaded file="+serveFile+" running=2 unchanged=1 started=1 stopped=1") {
		t.Fatalf("the gateway's reload: want one forward kept, one restarted:\n%s", serve.Output())
	}
	reload(t, tunnel, 1)
	start := time.Now()
	tn.expect(t, `^RELOADING=1\n`)
	tn.expect(t, `^READY=1\nSTATUS=2 forwards running`)
	if !strings.Contains(tunnel.Output(), "msg=reloaded file="+tunnelFile+" running=2 unchanged=1 started=1 stopped=1") {
		t.Fatalf("the tunnel's reload: want one forward kept, one added, one removed:\n%s", tunnel.Output())
	}
	roundTrip(t, kept, genData(200000, 2))
	checkEcho(t, ports["T3"], genData(100000, 3)) // through the restarted "two", with lz4
	if c, err := net.Dial("tcp", ports["T2"]); err == nil {
		c.Close()
		t.Fatalf("the removed forward still accepts on %s", ports["T2"])
	}
	// The removed forward's connection drains: it works within the
	// grace period, then is reset.
	roundTrip(t, removed, genData(30000, 4))
	removed.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := removed.Read(make([]byte, 1))
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the removed forward's connection after its grace: read %d bytes, %v; want a reset", n, err)
	}
	if took := time.Since(start); took < 1500*time.Millisecond {
		t.Errorf("the removed forward's connection was cut after %v, before its 2s grace", took)
	}

	// 2. A file with an error changes nothing, and says why.
	writeFile(t, tunnelFile, expand(tunnelText)+"\n[[forward]]\nlisten = \"@T4\"\nto = \n")
	reload(t, tunnel, 2)
	tn.expect(t, `^RELOADING=1\n`)
	tn.expect(t, `^READY=1\n`)
	if !regexp.MustCompile(`msg="reload refused: the forwards keep running as they were" file=\S+ running=2 err="\S+tunnel.toml:\d+:\d+: `).MatchString(tunnel.Output()) {
		t.Fatalf("a file with a syntax error: want the reload refused, with the line:\n%s", tunnel.Output())
	}
	// 3. A port someone else holds refuses the reload before anything
	// stops: "added" would go, and stays.
	held, err := net.Listen("tcp", ports["T4"])
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	writeFile(t, tunnelFile, expand(strings.Replace(tunnelText, "@T2", "@T4", 1)))
	reload(t, tunnel, 3)
	if !regexp.MustCompile(`msg="reload refused: the forwards keep running as they were" file=\S+ running=2 err="forward removed: listen tcp \S+: bind: address already in use"`).MatchString(tunnel.Output()) {
		t.Fatalf("a port in use: want the reload refused, naming it:\n%s", tunnel.Output())
	}
	roundTrip(t, kept, genData(100000, 5))
	checkEcho(t, ports["T3"], genData(100000, 6))

	// SIGTERM: systemd is told, and both exit 0 (checked by Stop).
	tunnel.Stop(t)
	tn.expect(t, `^RELOADING=1\n`)
	tn.expect(t, `^READY=1\n`)
	tn.expect(t, `^STOPPING=1\n$`)
	serve.Stop(t)
	sn.expect(t, `^STOPPING=1\n$`)
}

// TestForwardsRoutingReload: SIGHUP brings an edit of the routing
// configuration to the running forwards it decides for (a forward
// without --stack), as an edit of the forwards file does: the forward
// restarts with it, its open connection draining, and a reload with
// nothing changed keeps it. A listen address written another way
// (localhost for 127.0.0.1) restarts the forward on its port.
func TestForwardsRoutingReload(t *testing.T) {
	testenv.Programs(t, "socat")
	_, echo := startSocatEcho(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "config.toml")
	writeFile(t, config, "# every destination direct\n")
	t.Setenv("VLINK_CONFIG", config)
	listen := fmt.Sprintf("127.0.0.1:%d", realserver.FreePort(t))
	file := filepath.Join(dir, "tunnel.toml")
	writeFile(t, file, fmt.Sprintf("[[forward]]\nname = \"routed\"\nlisten = %q\nto = %q\n", listen, echo))
	tunnel := startProc(t, vlinkBin, "tunnel", "--forwards", file, "--grace", "5s")
	tunnel.Name, tunnel.CleanExit = "vlink tunnel", true
	tunnel.WaitFor(t, regexp.MustCompile(`msg="running forwards" file=\S+ count=1`), startTimeout)
	kept := openEcho(t, listen)

	reload(t, tunnel, 1)
	if !strings.Contains(tunnel.Output(), "msg=reloaded file="+file+" running=1 unchanged=1 started=0 stopped=0") {
		t.Fatalf("a reload with nothing changed: want the forward kept:\n%s", tunnel.Output())
	}
	// The same port written another way: the forward restarts on it
	// (the old one stops first), rather than the reload being refused.
	_, port, _ := net.SplitHostPort(listen)
	writeFile(t, file, fmt.Sprintf("[[forward]]\nname = \"routed\"\nlisten = \"localhost:%s\"\nto = %q\n", port, echo))
	reload(t, tunnel, 2)
	if !strings.Contains(tunnel.Output(), "msg=reloaded file="+file+" running=1 unchanged=0 started=1 stopped=1") {
		t.Fatalf("the listen address written as localhost: want the forward restarted on its port:\n%s", tunnel.Output())
	}
	checkEcho(t, listen, genData(20000, 8))
	writeFile(t, config, "[default]\naction = \"refuse\"\n")
	reload(t, tunnel, 3)
	if !strings.Contains(tunnel.Output(), "msg=reloaded file="+file+" running=1 unchanged=0 started=1 stopped=1\n") ||
		strings.Count(tunnel.Output(), "started=1 stopped=1") != 2 {
		t.Fatalf("the routing configuration edited: want the forward restarted:\n%s", tunnel.Output())
	}
	// New connections follow the new rules.
	wantRefused(t, listen)
	// The one opened before drains on the old rules.
	roundTrip(t, kept, genData(30000, 7))
}

// wantRefused checks that a connection to addr is refused with a reset,
// which on loopback may come before the dial has returned. The first
// call after the reset arrives gets it, and the kernel reports it once:
// when it lands before the write, the write has it and a read after
// sees only the end (as a client that writes first would).
func wantRefused(t *testing.T, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, startTimeout)
	if err == nil {
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err = c.Write([]byte("hello")); err == nil {
			_, err = c.Read(make([]byte, 16))
		}
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("a connection to %s: %v; want the refusal's reset", addr, err)
	}
}

// TestHangupReloadsRouting: a tunnel started with flags only, whose
// routing configuration decides (no --stack), takes an edit of it on
// SIGHUP: its forward restarts on its port, the open connection
// draining.
func TestHangupReloadsRouting(t *testing.T) {
	testenv.Programs(t, "socat")
	_, echo := startSocatEcho(t)
	config := filepath.Join(t.TempDir(), "config.toml")
	writeFile(t, config, "# every destination direct\n")
	t.Setenv("VLINK_CONFIG", config)
	listen := fmt.Sprintf("127.0.0.1:%d", realserver.FreePort(t)) // port 0 would be another port after the restart
	tunnel := startProc(t, vlinkBin, "tunnel", "--to", echo, "--listen", listen, "--grace", "5s")
	tunnel.Name, tunnel.CleanExit = "vlink tunnel", true
	tunnel.WaitFor(t, listenAddrRE, startTimeout)
	kept := openEcho(t, listen)
	writeFile(t, config, "[default]\naction = \"refuse\"\n")
	reload(t, tunnel, 1)
	if !strings.Contains(tunnel.Output(), `msg=reloaded from="the command line" running=1 unchanged=0 started=1 stopped=1`) {
		t.Fatalf("the routing configuration edited: want the forward restarted:\n%s", tunnel.Output())
	}
	wantRefused(t, listen)
	roundTrip(t, kept, genData(30000, 9))
}

// TestForwardsExitCodes checks what systemd's Restart= logic relies on:
// a bad file at start is a usage error (2: restarting cannot fix it), a
// port in use a runtime failure (1).
func TestForwardsExitCodes(t *testing.T) {
	dir := t.TempDir()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	for _, tc := range []struct {
		name, file string
		args       []string
		code       int
		stderr     string
	}{
		{"unknown key", "[[forward]]\nlisten = \"127.0.0.1:0\"\nto = \"127.0.0.1:1\"\nkeyfile = \"k\"\n", nil, 2,
			`forward 1: unknown key "keyfile": did you mean key_file?`},
		{"process flag in the file", "[[forward]]\nto = \"127.0.0.1:1\"\ngrace = \"1s\"\n", nil, 2,
			"grace applies to the whole process, not to one forward: give --grace on the command line"},
		{"no forward", "listen = \"127.0.0.1:0\"\n", nil, 2, "only [[forward]] tables belong in the file"},
		{"forward flag on the command line", "[[forward]]\nto = \"127.0.0.1:1\"\n", []string{"--stack", "tcp"}, 2,
			"--stack with --forwards: each forward's settings go in the file"},
		{"port in use", fmt.Sprintf("[[forward]]\nlisten = %q\nto = \"127.0.0.1:1\"\nstack = \"tcp\"\n", held.Addr()), nil, 1,
			"address already in use"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".toml")
			writeFile(t, path, tc.file)
			_, stderr, err := run(startTimeout, nil, vlinkBin, append([]string{"tunnel", "--forwards", path}, tc.args...)...)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tc.code {
				t.Fatalf("exit: %v, want status %d; stderr:\n%s", err, tc.code, stderr)
			}
			if !strings.Contains(stderr, tc.stderr) {
				t.Errorf("stderr does not say %q:\n%s", tc.stderr, stderr)
			}
		})
	}
}

// TestSystemdUnit checks the example unit with systemd's own reader,
// with ExecStart pointing at the binary under test.
func TestSystemdUnit(t *testing.T) {
	testenv.Programs(t, "systemd-analyze")
	unit, err := os.ReadFile("../docs/systemd/vlink@.service")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(unit), "/usr/local/bin/vlink", vlinkBin)
	if text == string(unit) {
		t.Fatal("the unit does not run /usr/local/bin/vlink")
	}
	path := filepath.Join(t.TempDir(), "vlink@.service")
	writeFile(t, path, text)
	out, err := exec.Command("systemd-analyze", "verify", path).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestForwardsSSHDown publishes a port on a real sshd's side (ssh -R) as
// one forward of a file, beside a local one, and stops sshd and all its
// sessions: the local forward keeps working, the published port closes,
// and it comes back by itself once sshd does, as the ssh factory's
// listener dials again.
func TestForwardsSSHDown(t *testing.T) {
	testenv.Programs(t, "socat")
	_, echo := startSocatEcho(t)
	s := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true})
	publishedPort := realserver.FreePort(t)
	published := fmt.Sprintf("127.0.0.1:%d", publishedPort)
	local := fmt.Sprintf("127.0.0.1:%d", realserver.FreePort(t))
	file := filepath.Join(t.TempDir(), "tunnels.toml")
	writeFile(t, file, fmt.Sprintf("[[forward]]\nname = \"published\"\nlisten_stack = %q\nlisten = %q\nto = %q\nstack = \"tcp\"\n", sshLayer(s), published, echo)+
		fmt.Sprintf("[[forward]]\nname = \"local\"\nlisten = %q\nto = %q\nstack = \"tcp\"\n", local, echo))
	tunnel := startProc(t, vlinkBin, "tunnel", "--forwards", file, "--grace", "1s")
	tunnel.Name, tunnel.CleanExit = "vlink tunnel", true
	tunnel.WaitFor(t, regexp.MustCompile(`msg="running forwards" file=\S+ count=2`), startTimeout)
	checkEcho(t, published, genData(100000, 1))
	tree := append(realserver.Descendants(s.Proc.Pid()), s.Proc.Pid())
	// sshd's processes, sessions made later included, inherit its
	// stderr (-e): the pipe to this test names them.
	stderr, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/2", s.Proc.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	ours := func(pid int) bool {
		e, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/2", pid))
		return err == nil && e == stderr
	}
	t.Logf("sshd's tree %v; %s listened by %s", tree, published, portHolders(publishedPort))

	// sshd and its sessions, which hold the published port and call
	// setsid: Stop ends them all (realserver.Proc.Stop).
	s.Proc.Stop(t)
	t.Logf("right after the stop: %s listened by %s", published, portHolders(publishedPort))
	checkEcho(t, local, genData(100000, 2))
	// The kernel closes the published port as soon as its holder exits.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		held := false
		for _, h := range holders(publishedPort) {
			held = held || ours(h.pid)
		}
		if !held {
			break
		}
		if time.Now().After(deadline) {
			out, _ := exec.Command("ss", "-ltnp", fmt.Sprintf("sport = :%d", publishedPort)).CombinedOutput()
			t.Fatalf("%s still listens 5 s after sshd and its sessions stopped, held by sshd's: %s\n%s", published, portHolders(publishedPort), out)
		}
	}
	if procnet.TCPListening(publishedPort) {
		// Tests running beside this one may take a port the moment
		// it is free.
		t.Logf("%s is taken again, by %s", published, portHolders(publishedPort))
	} else if c, err := net.DialTimeout("tcp", published, 5*time.Second); err == nil {
		c.Close()
		t.Fatalf("%s accepts after sshd stopped, with nothing listening", published)
	}

	sshd := realserver.Start(t, s.Program, "-D", "-e", "-f", s.ConfigFile)
	sshd.WaitListening(t, s.Port)
	for deadline := time.Now().Add(45 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got, err := exchange(t, published, genData(100000, 3), 10*time.Second)
		if err == nil && testnet.Sum(got) == testnet.Sum(genData(100000, 3)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the published port did not come back with sshd: %v\n%s", err, tunnel.Output())
		}
	}
	if !tunnel.Running() || strings.Contains(tunnel.Output(), "level=ERROR") {
		t.Errorf("the tunnel failed:\n%s", tunnel.Output())
	}
}

// A holder is a process with a socket listening on a port.
type holder struct {
	pid  int
	desc string // pid, name, parent, process group and session
}

// holders lists the processes holding a socket that listens on port.
func holders(port int) []holder {
	inodes := procnet.TCPListeners(port)
	if len(inodes) == 0 {
		return nil
	}
	var out []holder
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || !procnet.Holds(pid, inodes) {
			continue
		}
		h := holder{pid: pid, desc: fmt.Sprintf("pid %d", pid)}
		// pid (comm) state ppid pgrp session ...
		stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if i, j := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')'); i >= 0 && j > i {
			if f := strings.Fields(string(stat[j+1:])); len(f) >= 4 {
				h.desc = fmt.Sprintf("pid %d (%s) ppid %s pgrp %s session %s", pid, stat[i+1:j], f[1], f[2], f[3])
			}
		}
		out = append(out, h)
	}
	return out
}

// portHolders says which processes hold a socket listening on port.
func portHolders(port int) string {
	hs := holders(port)
	if len(hs) == 0 {
		if inodes := procnet.TCPListeners(port); len(inodes) > 0 {
			return fmt.Sprintf("sockets %v, held by no process found", inodes)
		}
		return "nothing"
	}
	var d []string
	for _, h := range hs {
		d = append(d, h.desc)
	}
	return strings.Join(d, "; ")
}
