//go:build linux

package ssh_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	_ "github.com/vlink-dev/vlink/factories/socks"
	"github.com/vlink-dev/vlink/factories/ssh"
	_ "github.com/vlink-dev/vlink/factories/tcp"
	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink"
)

func TestMain(m *testing.M) {
	// No test may depend on the user's agent or ssh config.
	os.Unsetenv("SSH_AUTH_SOCK")
	goleak.VerifyTestMain(m)
}

// closeAll drops the shared connections at the end of each test.
func closeAll(t *testing.T) { t.Cleanup(ssh.CloseAll) }

// layer is the ssh layer's text for sshd, with extra parameters.
func layer(s *realserver.SSHD, extra ...string) string {
	p := []string{"host=" + s.Host, fmt.Sprintf("port=%d", s.Port), "user=" + s.User, "identity=" + s.UserKey.Private,
		"known-hosts=" + s.KnownHosts, "agent=false", "config=none"}
	return "ssh:" + strings.Join(append(p, extra...), ",")
}

func dial(t testing.TB, stack, addr string) (net.Conn, error) {
	t.Helper()
	s, err := vlink.Parse(stack)
	if err != nil {
		t.Fatal(err)
	}
	d := vlink.Dialer{Stack: s, Timeout: 10 * time.Second}
	return d.Dial("tcp", addr)
}

func logins(s *realserver.SSHD) int {
	return strings.Count(s.Output(), "Accepted publickey")
}

// TestDirect carries data through direct-tcpip channels of a real sshd,
// to an address and to a name the server resolves, and checks that the
// dials share one SSH connection.
func TestDirect(t *testing.T) {
	closeAll(t)
	s := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true})
	echo := testnet.EchoServer(t)
	_, port, _ := net.SplitHostPort(echo)
	for i, dest := range []string{echo, "localhost:" + port, echo} {
		c, err := dial(t, layer(s), dest)
		if err != nil {
			t.Fatal(err)
		}
		testnet.RoundTrip(t, c, 1<<20+i)
		c.Close()
	}
	// Concurrent tunnels.
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := dial(t, layer(s), echo)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			testnet.RoundTrip(t, c, 256<<10)
		}()
	}
	wg.Wait()
	if n := logins(s); n != 1 {
		t.Fatalf("sshd logged %d logins for 11 tunnels, want 1 shared connection", n)
	}
	if n := ssh.Connections(); n != 1 {
		t.Fatalf("%d SSH connections up, want 1", n)
	}

	// share=false: one SSH connection per tunnel, closed with it.
	c, err := dial(t, layer(s, "share=false"), echo)
	if err != nil {
		t.Fatal(err)
	}
	testnet.RoundTrip(t, c, 1000)
	c.Close()
	if n := logins(s); n != 2 {
		t.Fatalf("share=false: %d logins, want 2", n)
	}

	// A port the server cannot reach: the refusal names the server.
	closed := testnet.RefusedAddr(t)
	_, err = dial(t, layer(s), closed)
	var oe *ssh.OpenError
	if !errors.As(err, &oe) || !errors.Is(err, ssh.ErrOpenRefused) || !errors.Is(err, vlink.ErrUnreachable) || !strings.Contains(err.Error(), s.Addr) {
		t.Fatalf("closed port: %v, want an OpenError matching ErrUnreachable naming %s", err, s.Addr)
	}
}

// TestNetcat runs against an sshd that forbids forwarding: direct-tcpip
// is refused, netcat mode carries data through nc, and nc's failure is
// an error with its message.
func TestNetcat(t *testing.T) {
	closeAll(t)
	testenv.Programs(t, "nc")
	s := realserver.StartSSHD(t, realserver.SSHDOptions{})
	echo := testnet.EchoServer(t)

	_, err := dial(t, layer(s), echo)
	if !errors.Is(err, ssh.ErrOpenRefused) || !errors.Is(err, vlink.ErrNotAllowed) {
		t.Fatalf("direct-tcpip on a server that forbids forwarding: %v, want ErrOpenRefused and ErrNotAllowed", err)
	}
	for i := 0; i < 3; i++ {
		c, err := dial(t, layer(s, "mode=netcat"), echo)
		if err != nil {
			t.Fatal(err)
		}
		testnet.RoundTrip(t, c, 2<<20+i)
		c.Close()
	}
	closed := testnet.RefusedAddr(t)
	c, err := dial(t, layer(s, "mode=netcat"), closed)
	if err != nil {
		t.Fatal(err) // the command starts; its failure shows on the first read
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Read(make([]byte, 1))
	if !errors.Is(err, ssh.ErrCommand) || !strings.Contains(err.Error(), "exited with status 1") {
		t.Fatalf("netcat to a closed port: read = %v, want ErrCommand with the exit status", err)
	}
	// A destination with a quote cannot escape its quoting in the
	// command the server's shell runs.
	pwned := filepath.Join(t.TempDir(), "pwned")
	if c, err := dial(t, layer(s, "mode=netcat"), "a';touch "+pwned+";'b:80"); err == nil {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
		if !errors.Is(err, ssh.ErrCommand) {
			t.Errorf("netcat to a host name with quotes: %v, want nc's failure", err)
		}
	}
	if _, serr := os.Stat(pwned); serr == nil {
		t.Fatal("a destination's name ran a command on the server")
	}
}

// TestReverse publishes a local echo server through sshd's tcpip-forward,
// as ssh -R does, and reaches it on the server's side.
func TestReverse(t *testing.T) {
	closeAll(t)
	s := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true})
	l, err := vlink.ListenStack(context.Background(), vlink.MustParse(layer(s)), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go serveEcho(l)
	addr := l.Addr().String()
	if strings.HasSuffix(addr, ":0") {
		t.Fatalf("listener address %s: the server's chosen port is missing", addr)
	}
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", addr) // the server's side, here on loopback too
		if err != nil {
			t.Fatal(err)
		}
		testnet.RoundTrip(t, c, 1<<20+i)
		c.Close()
	}

	// A server that forbids forwarding refuses to listen.
	s2 := realserver.StartSSHD(t, realserver.SSHDOptions{})
	_, err = vlink.ListenStack(context.Background(), vlink.MustParse(layer(s2)), "tcp", "127.0.0.1:0")
	if !errors.Is(err, ssh.ErrListenRefused) || !strings.Contains(err.Error(), s2.Addr) {
		t.Fatalf("listening on a server that forbids it: %v, want ErrListenRefused naming %s", err, s2.Addr)
	}
}

func serveEcho(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			io.Copy(c, c)
			c.(interface{ CloseWrite() error }).CloseWrite()
		}()
	}
}

// droppable is a forward dialer whose connections the test can cut, as a
// network failure would.
type droppable struct {
	mu    sync.Mutex
	conns []net.Conn
	dials int
}

func (d *droppable) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, address)
	if err == nil {
		d.mu.Lock()
		d.conns = append(d.conns, c)
		d.dials++
		d.mu.Unlock()
	}
	return c, err
}

func (d *droppable) drop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		c.Close()
	}
	d.conns = nil
}

func (d *droppable) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dials
}

func factory(t *testing.T, s *realserver.SSHD, o ssh.Options) *ssh.Factory {
	t.Helper()
	o.Host, o.Port, o.User = s.Host, s.Port, s.User
	o.IdentityFiles, o.KnownHosts, o.NoAgent, o.ConfigFile = []string{s.UserKey.Private}, []string{s.KnownHosts}, true, "none"
	f, err := ssh.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestReconnect cuts the SSH connection under an open tunnel: the tunnel
// fails with ErrLost (not a silent EOF), the next dial connects again,
// and a reverse listener asks the server to listen again.
func TestReconnect(t *testing.T) {
	closeAll(t)
	s := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true})
	echo := testnet.EchoServer(t)
	fw := &droppable{}
	f := factory(t, s, ssh.Options{})
	ctx := context.Background()

	c, err := f.DialContext(ctx, "tcp", echo, fw)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := f.Listen(ctx, "tcp", "127.0.0.1:0", fw)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go serveEcho(l)
	if n := fw.count(); n != 1 {
		t.Fatalf("a dial and a listener made %d SSH connections, want 1", n)
	}

	fw.drop()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, ssh.ErrLost) {
		t.Fatalf("read on a tunnel whose SSH connection dropped: %v, want ErrLost", err)
	}
	c2, err := f.DialContext(ctx, "tcp", echo, fw)
	if err != nil {
		t.Fatalf("dial after the drop: %v", err)
	}
	testnet.RoundTrip(t, c2, 100<<10)
	c2.Close()

	// The listener comes back on the same port.
	deadline := time.Now().Add(15 * time.Second)
	for {
		rc, err := net.Dial("tcp", l.Addr().String())
		if err == nil {
			rc.SetDeadline(time.Now().Add(5 * time.Second))
			rc.Write([]byte("x"))
			b := make([]byte, 1)
			_, err = io.ReadFull(rc, b)
			rc.Close()
			if err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reverse listener did not come back: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestHostKeys checks known_hosts: an unknown key is refused with its
// fingerprint unless accept-new, which records it; a changed key is
// always refused; insecure-ignore is the only way past.
func TestHostKeys(t *testing.T) {
	closeAll(t)
	s := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true})
	echo := testnet.EchoServer(t)
	dir := t.TempDir()
	empty := filepath.Join(dir, "known_hosts")

	base := layer(s, "persist=0")
	withKH := func(kh string, extra ...string) string {
		return strings.Replace(base, "known-hosts="+s.KnownHosts, "known-hosts="+kh, 1) + "," + strings.Join(extra, ",")
	}
	_, err := dial(t, withKH(empty, "host-key-check=strict"), echo)
	var hke *ssh.HostKeyError
	fp := "SHA256:" + strings.TrimPrefix(fingerprint(s), "SHA256:")
	if !errors.As(err, &hke) || !errors.Is(err, ssh.ErrHostKeyUnknown) || hke.Fingerprint != fp ||
		!strings.Contains(err.Error(), fp) || !strings.Contains(err.Error(), "["+s.Host+"]:") {
		t.Fatalf("unknown host key: %v, want a HostKeyError with %s", err, fp)
	}
	// What the user reads says which files were looked for or read, and
	// the command that adds the key.
	keyscan := fmt.Sprintf("ssh-keyscan -p %d %s >> ", s.Port, s.Host)
	if msg := err.Error(); !strings.Contains(msg, "no known_hosts file to check it against (looked for "+empty+")") ||
		!strings.Contains(msg, keyscan+empty) || !strings.Contains(msg, fmt.Sprintf("ssh -p %d %s", s.Port, s.Host)) {
		t.Errorf("unknown host key, no known_hosts file: the message does not say so, nor how to add the key:\n%s", msg)
	}
	other := realserver.NewKey(t, dir, "other", "")
	unrelated := filepath.Join(dir, "unrelated")
	os.WriteFile(unrelated, []byte(realserver.KnownHostsLine("192.0.2.1:22", other.Public)), 0o600)
	_, err = dial(t, withKH(unrelated, "host-key-check=strict"), echo)
	if msg := fmt.Sprint(err); !errors.Is(err, ssh.ErrHostKeyUnknown) ||
		!strings.Contains(msg, "none of the known_hosts files read ("+unrelated+") holds it") || !strings.Contains(msg, keyscan+unrelated) {
		t.Errorf("unknown host key, known_hosts without it: the message does not name the file read and the command:\n%s", msg)
	}
	if _, err := os.Stat(empty); err == nil {
		t.Fatal("strict checking wrote known_hosts")
	}
	c, err := dial(t, withKH(empty, "host-key-check=accept-new"), echo)
	if err != nil {
		t.Fatalf("accept-new: %v", err)
	}
	c.Close()
	c, err = dial(t, withKH(empty, "host-key-check=strict"), echo)
	if err != nil {
		t.Fatalf("strict after accept-new recorded the key: %v", err)
	}
	c.Close()
	b, _ := os.ReadFile(empty)
	if strings.Count(string(b), "\n") != 1 {
		t.Fatalf("known_hosts after accept-new:\n%s", b)
	}

	// A changed key: known_hosts holds another one.
	changed := filepath.Join(dir, "changed")
	os.WriteFile(changed, []byte(realserver.KnownHostsLine(s.Addr, other.Public)), 0o600)
	for _, check := range []string{"strict", "accept-new"} {
		_, err := dial(t, withKH(changed, "host-key-check="+check), echo)
		if !errors.As(err, &hke) || !errors.Is(err, ssh.ErrHostKeyChanged) || len(hke.Known) != 1 ||
			!strings.Contains(err.Error(), changed+":1") || !strings.Contains(err.Error(), "ssh-keygen -R") {
			t.Fatalf("changed key with %s: %v, want ErrHostKeyChanged naming %s:1", check, err, changed)
		}
	}
	c, err = dial(t, withKH(changed, "host-key-check=insecure-ignore"), echo)
	if err != nil {
		t.Fatalf("insecure-ignore: %v", err)
	}
	c.Close()
}

func fingerprint(s *realserver.SSHD) string {
	out, _ := exec.Command("ssh-keygen", "-lf", s.HostKey.Private+".pub").Output()
	f := strings.Fields(string(out))
	if len(f) < 2 {
		return "?"
	}
	return f[1]
}

// TestAuth checks the ways in: a key the server does not know is ErrAuth
// naming the user and server; the agent's keys work with no key file;
// an encrypted key asks for its passphrase, or says to use the agent
// when it cannot ask.
func TestAuth(t *testing.T) {
	closeAll(t)
	s := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true})
	echo := testnet.EchoServer(t)
	dir := t.TempDir()

	stranger := realserver.NewKey(t, dir, "stranger", "")
	_, err := dial(t, strings.Replace(layer(s), s.UserKey.Private, stranger.Private, 1), echo)
	if !errors.Is(err, ssh.ErrAuth) || !errors.Is(err, vlink.ErrAuth) || !strings.Contains(err.Error(), s.User) || !strings.Contains(err.Error(), s.Addr) {
		t.Fatalf("unknown key: %v, want ErrAuth naming %s and %s", err, s.User, s.Addr)
	}

	// An encrypted key, authorized too.
	locked := realserver.NewKey(t, dir, "locked", "open sesame")
	ak := filepath.Join(s.Dir, "authorized_keys")
	f, _ := os.OpenFile(ak, os.O_APPEND|os.O_WRONLY, 0)
	fmt.Fprintln(f, locked.AuthorizedLine)
	f.Close()
	asked := 0
	fac, err := ssh.New(ssh.Options{Host: s.Host, Port: s.Port, User: s.User, IdentityFiles: []string{locked.Private},
		KnownHosts: []string{s.KnownHosts}, NoAgent: true, ConfigFile: "none", Persist: -1,
		Prompt: func(q string) ([]byte, error) {
			asked++
			if !strings.Contains(q, locked.Private) {
				t.Errorf("prompt %q does not name the key", q)
			}
			return []byte("open sesame"), nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := fac.DialContext(context.Background(), "tcp", echo, nil)
	if err != nil || asked != 1 {
		t.Fatalf("encrypted key with a prompt: %v, asked %d times", err, asked)
	}
	testnet.RoundTrip(t, c, 1000)
	c.Close()

	// No terminal to ask on (go test has none): the error says what to do.
	locked2 := realserver.NewKey(t, dir, "locked2", "pw2")
	f, _ = os.OpenFile(ak, os.O_APPEND|os.O_WRONLY, 0)
	fmt.Fprintln(f, locked2.AuthorizedLine)
	f.Close()
	if tty, terr := os.Open("/dev/tty"); terr == nil {
		tty.Close()
		t.Log("a terminal is at hand: the no-terminal case is not tested")
	} else {
		_, err = dial(t, strings.Replace(layer(s), s.UserKey.Private, locked2.Private, 1), echo)
		if err == nil || !strings.Contains(err.Error(), "ssh-add "+locked2.Private) {
			t.Fatalf("encrypted key without a terminal: %v, want advice to ssh-add it", err)
		}
	}

	// The agent: ssh-agent holding the user key, no key file given.
	testenv.Programs(t, "ssh-agent", "ssh-add")
	sock := filepath.Join(dir, "agent.sock")
	realserver.Start(t, "ssh-agent", "-D", "-a", sock)
	for i := 0; ; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if i > 200 {
			t.Fatal("ssh-agent did not make its socket")
		}
		time.Sleep(10 * time.Millisecond)
	}
	add := exec.Command("ssh-add", s.UserKey.Private)
	add.Env = append(os.Environ(), "SSH_AUTH_SOCK="+sock)
	if out, err := add.CombinedOutput(); err != nil {
		t.Fatalf("ssh-add: %v: %s", err, out)
	}
	t.Setenv("SSH_AUTH_SOCK", sock)
	noKey := strings.Replace(strings.Replace(layer(s), "identity="+s.UserKey.Private+",", "identity="+filepath.Join(dir, "missing")+",", 1), "agent=false", "agent=true", 1)
	c, err = dial(t, noKey, echo)
	if err != nil {
		t.Fatalf("with the agent: %v", err)
	}
	testnet.RoundTrip(t, c, 1000)
	c.Close()
}

// TestConfig reads an ssh config: a Host alias with HostName, Port, User
// and IdentityFile, and a ProxyJump through a second sshd, which must
// see the forwarding request.
func TestConfig(t *testing.T) {
	closeAll(t)
	target := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true})
	jump := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true, LogLevel: "DEBUG1"})
	// One known_hosts and one authorized key for both.
	kh := filepath.Join(t.TempDir(), "known_hosts")
	os.WriteFile(kh, []byte(realserver.KnownHostsLine(target.Addr, target.HostKey.Public)+
		realserver.KnownHostsLine(jump.Addr, jump.HostKey.Public)), 0o600)
	os.WriteFile(filepath.Join(jump.Dir, "authorized_keys"), []byte(jump.UserKey.AuthorizedLine+"\n"+target.UserKey.AuthorizedLine+"\n"), 0o600)
	cfg := filepath.Join(t.TempDir(), "config")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`Host bastion
  HostName %s
  Port %d
  User %s
  IdentityFile %s

Host inner
  HostName %s
  Port %d
  User %s
  IdentityFile %s
  ProxyJump bastion

Host *
  User nobody-by-default
`, jump.Host, jump.Port, jump.User, target.UserKey.Private, target.Host, target.Port, target.User, target.UserKey.Private)), 0o600)
	echo := testnet.EchoServer(t)

	c, err := dial(t, "ssh:host=bastion,agent=false,known-hosts="+kh+",config="+cfg, echo)
	if err != nil {
		t.Fatalf("through the alias: %v", err)
	}
	testnet.RoundTrip(t, c, 1000)
	c.Close()
	before := strings.Count(jump.Output(), "direct-tcpip")
	c, err = dial(t, "ssh:host=inner,agent=false,known-hosts="+kh+",config="+cfg, echo)
	if err != nil {
		t.Fatalf("through ProxyJump: %v", err)
	}
	testnet.RoundTrip(t, c, 1000)
	c.Close()
	if after := strings.Count(jump.Output(), "direct-tcpip"); after <= before {
		t.Fatalf("the jump host logged no direct-tcpip request for ProxyJump")
	}
	if logins(target) != 1 {
		t.Fatalf("the target logged %d logins, want 1", logins(target))
	}

	// The same by stacking: ssh over ssh, and ssh over SOCKS (ssh -D).
	before = strings.Count(jump.Output(), "direct-tcpip")
	stacked := fmt.Sprintf("ssh:host=%s,port=%d,user=%s,identity=%s,known-hosts=%s,agent=false,config=none+%s",
		target.Host, target.Port, target.User, target.UserKey.Private, kh,
		strings.NewReplacer("known-hosts="+jump.KnownHosts, "known-hosts="+kh, jump.UserKey.Private, target.UserKey.Private).Replace(layer(jump)))
	c, err = dial(t, stacked, echo)
	if err != nil {
		t.Fatalf("ssh over ssh: %v", err)
	}
	testnet.RoundTrip(t, c, 1<<20)
	c.Close()
	if after := strings.Count(jump.Output(), "direct-tcpip"); after <= before {
		t.Fatalf("the jump host logged no direct-tcpip request for the stacked jump")
	}
	socksAddr := jump.StartDynamic(t)
	viaSocks := fmt.Sprintf("ssh:host=%s,port=%d,user=%s,identity=%s,known-hosts=%s,agent=false,config=none,share=false+socks5:addr=%s",
		target.Host, target.Port, target.User, target.UserKey.Private, kh, socksAddr)
	c, err = dial(t, viaSocks, echo)
	if err != nil {
		t.Fatalf("ssh over socks5: %v", err)
	}
	testnet.RoundTrip(t, c, 1<<20)
	c.Close()
}

// TestBadServers checks servers that are not SSH servers, or stop in the
// middle: a clear error naming the server, within the deadline, no leak.
func TestBadServers(t *testing.T) {
	closeAll(t)
	for _, tc := range []struct {
		name   string
		script func(c net.Conn)
	}{
		{"http", func(c net.Conn) { io.WriteString(c, "HTTP/1.0 400 Bad Request\r\n\r\n") }},
		{"garbage banner", func(c net.Conn) { io.WriteString(c, "SSH-2.0-x\r\n\x00\x00\x00\x05garbage") }},
		{"closes after banner", func(c net.Conn) { io.WriteString(c, "SSH-2.0-OpenSSH_9.2\r\n") }},
		{"silent", func(c net.Conn) { io.Copy(io.Discard, c) }},
		{"endless banner", func(c net.Conn) {
			for i := 0; i < 1000; i++ {
				if _, err := io.WriteString(c, strings.Repeat("x", 200)+"\r\n"); err != nil {
					return
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := testnet.Listen(t, func(c net.Conn) {
				c.SetDeadline(time.Now().Add(5 * time.Second))
				tc.script(c)
			})
			host, port, _ := net.SplitHostPort(addr)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			d := vlink.Dialer{Stack: vlink.MustParse(fmt.Sprintf("ssh:host=%s,port=%s,user=u,agent=false,config=none,known-hosts=/nonexistent,identity=/nonexistent", host, port))}
			start := time.Now()
			_, err := d.DialContext(ctx, "tcp", "127.0.0.1:80")
			if err == nil {
				t.Fatal("dial succeeded")
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Fatalf("took %v", took)
			}
			var oe *net.OpError
			if !errors.As(err, &oe) || oe.Net != "ssh" || oe.Addr.String() != addr {
				t.Fatalf("error %v does not name the server %s", err, addr)
			}
		})
	}
}

// freezer is a forward dialer whose connections so far can be frozen, as
// a network path that silently stops carrying packets: reads block,
// writes vanish. Connections made after a freeze work.
type freezer struct {
	mu     sync.Mutex
	frozen chan struct{}
}

func newFreezer() *freezer { return &freezer{frozen: make(chan struct{})} }

func (f *freezer) freeze() {
	f.mu.Lock()
	close(f.frozen)
	f.frozen = make(chan struct{})
	f.mu.Unlock()
}

func (f *freezer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return &frozenConn{Conn: c, frozen: f.frozen, closed: make(chan struct{})}, nil
}

type frozenConn struct {
	net.Conn
	frozen, closed chan struct{}
	once           sync.Once
}

func (c *frozenConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	select {
	case <-c.frozen:
		<-c.closed
		return 0, net.ErrClosed
	default:
	}
	return n, err
}

func (c *frozenConn) Write(p []byte) (int, error) {
	select {
	case <-c.frozen:
		return len(p), nil
	default:
	}
	return c.Conn.Write(p)
}

func (c *frozenConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// TestKeepAlive freezes the path to the server under an open tunnel:
// the unanswered keepalives close the SSH connection within three
// intervals, the tunnel fails with ErrLost, and the next dial connects
// again.
func TestKeepAlive(t *testing.T) {
	closeAll(t)
	s := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true})
	echo := testnet.EchoServer(t)
	fz := newFreezer()
	f := factory(t, s, ssh.Options{KeepAlive: 200 * time.Millisecond})
	c, err := f.DialContext(context.Background(), "tcp", echo, fz)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fz.freeze()
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Read(make([]byte, 1))
	if !errors.Is(err, ssh.ErrLost) || !strings.Contains(err.Error(), "keepalives") {
		t.Fatalf("read on a frozen path: %v after %v, want ErrLost from the keepalives", err, time.Since(start))
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("the dead connection was noticed after %v, want about 3 x 200ms", took)
	}
	c2, err := f.DialContext(context.Background(), "tcp", echo, fz)
	if err != nil {
		t.Fatalf("dial after the keepalives gave up: %v", err)
	}
	testnet.RoundTrip(t, c2, 1000)
	c2.Close()
}

// TestGCMFramed carries data with aes128-gcm only (where the transport
// writes each packet in one write) and with chacha20 (where it does not
// look at packets), through a real sshd, both ways.
func TestGCMFramed(t *testing.T) {
	closeAll(t)
	s := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true})
	echo := testnet.EchoServer(t)
	for _, cipher := range []string{"aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com", "aes128-ctr"} {
		c, err := dial(t, layer(s, "cipher="+cipher), echo)
		if err != nil {
			t.Fatalf("%s: %v", cipher, err)
		}
		testnet.RoundTrip(t, c, 8<<20+7)
		c.Close()
	}
}

// TestConcurrentFirstDials starts many dials at once on a server with no
// connection yet: they wait for one SSH handshake, and one whose context
// is cancelled does not fail the others.
func TestConcurrentFirstDials(t *testing.T) {
	closeAll(t)
	s := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true})
	echo := testnet.EchoServer(t)
	f := factory(t, s, ssh.Options{})
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			if i == 0 {
				ctx = cancelled
			}
			c, err := f.DialContext(ctx, "tcp", echo, nil)
			if i == 0 {
				if err == nil {
					c.Close()
				}
				return
			}
			if err != nil {
				t.Error(err)
				return
			}
			testnet.RoundTrip(t, c, 10000)
			c.Close()
		}()
	}
	wg.Wait()
	if n := logins(s); n != 1 {
		t.Fatalf("8 concurrent first dials made %d logins, want 1", n)
	}
}

// TestReadFrom sends data into a tunnel the ways a program or a relay
// does: netconn.Relay from a TCP socket (the tunnel's own path, which
// hands the channel the bytes queued on the socket), io.Copy from an
// io.LimitedReader, and io.Copy from a plain reader. The far end checks
// every byte by SHA-256 and sends back its digest.
func TestReadFrom(t *testing.T) {
	closeAll(t)
	s := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true})
	sink := testnet.Listen(t, func(c net.Conn) {
		h := sha256.New()
		io.Copy(h, c)
		c.Write(h.Sum(nil))
		c.Close()
	})
	data := testnet.RandomBytes(8<<20+5, 9)
	want := sha256.Sum256(data)
	// copyIn sends data with io.Copy, half-closes and reads the answer.
	copyIn := func(c net.Conn, src io.Reader) ([]byte, error) {
		if _, err := io.Copy(c, src); err != nil {
			return nil, err
		}
		if err := netconn.CloseWrite(c); err != nil {
			return nil, err
		}
		return io.ReadAll(c)
	}
	for _, tc := range []struct {
		name string
		send func(c net.Conn) ([]byte, error)
	}{
		{"relay", func(c net.Conn) ([]byte, error) {
			a, b := testnet.TCPPair(t)
			defer a.Close()
			go netconn.Relay(b, c)
			if _, err := a.Write(data); err != nil {
				return nil, err
			}
			a.CloseWrite()
			return io.ReadAll(a)
		}},
		{"limited", func(c net.Conn) ([]byte, error) {
			return copyIn(c, io.LimitReader(bytes.NewReader(data), int64(len(data))))
		}},
		{"reader", func(c net.Conn) ([]byte, error) {
			return copyIn(c, struct{ io.Reader }{bytes.NewReader(data)})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := dial(t, layer(s), sink)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			sum, err := tc.send(c)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(sum, want[:]) {
				t.Fatalf("the far end got other bytes (sha256 %x, want %x)", sum, want)
			}
		})
	}
}
