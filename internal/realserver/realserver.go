//go:build linux

// Package realserver starts the real servers that vlink's proxy and SSH
// factories are tested against: OpenSSH's sshd (with forwarding allowed
// or forbidden), ssh -D as a SOCKS4/SOCKS5 server, dante as a SOCKS5
// server with username authentication, and tinyproxy as an HTTP CONNECT
// proxy. Each listens on a free loopback port, with its configuration and
// generated keys in a temporary folder, and is stopped by t.Cleanup.
//
// It is for tests only. A missing program or privilege skips the test,
// or fails it where nothing may be skipped (package testenv decides).
package realserver

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vlink-dev/vlink/internal/testenv"
)

// FreePort returns a loopback port that is free for TCP and UDP both and
// that nothing else is likely to take before the caller's server binds it.
//
// A port the kernel picks for a listener on port 0 comes from the
// ephemeral range, from which every outgoing connect and every other
// port-0 listener draws too: between this function's close and the
// server's bind, another test can take it (slurmd once failed so). So
// the port is drawn at random from outside that range, which the kernel
// never hands out by itself, checked free on both protocols, and never
// returned twice by one process.
func FreePort(tb testing.TB) int {
	tb.Helper()
	lo, hi := ephemeralRange()
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 200 {
		// Below the range from 10000 (clear of the well-known services),
		// or above it.
		n := (lo - 10000) + (65535 - hi)
		if n <= 0 {
			break
		}
		p := 10000 + mrand.IntN(n)
		if p >= lo {
			p += hi - lo + 1
		}
		if portsGiven[p] || !portFree(p) {
			continue
		}
		portsGiven[p] = true
		return p
	}
	tb.Fatalf("no free port outside the ephemeral range %d-%d", lo, hi)
	return 0
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// ephemeralRange is the kernel's range for ports it picks itself
// (net.ipv4.ip_local_port_range), or Linux's default.
func ephemeralRange() (lo, hi int) {
	lo, hi = 32768, 60999
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return lo, hi
	}
	l, err1 := strconv.Atoi(f[0])
	h, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || l < 1024 || h > 65535 || l > h {
		return lo, hi
	}
	return l, h
}

// portFree reports whether p can be bound on every address, IPv4 and
// IPv6 (where the machine has it), for TCP and UDP: the server may take
// any of them.
func portFree(p int) bool {
	port := strconv.Itoa(p)
	for _, n := range []struct{ network, host string }{
		{"tcp4", "0.0.0.0"}, {"tcp6", "::"}, {"udp4", "0.0.0.0"}, {"udp6", "::"},
	} {
		addr := net.JoinHostPort(n.host, port)
		var c io.Closer
		var err error
		if strings.HasPrefix(n.network, "tcp") {
			c, err = net.Listen(n.network, addr)
		} else {
			c, err = net.ListenPacket(n.network, addr)
		}
		if errors.Is(err, syscall.EADDRINUSE) {
			return false
		}
		if err == nil { // else no such family here: as free as it can be
			c.Close()
		}
	}
	return true
}

// KeyPair is a generated ed25519 key.
type KeyPair struct {
	Private        string // path of the private key, OpenSSH format, mode 600
	Public         ssh.PublicKey
	AuthorizedLine string // the public key as authorized_keys writes it
}

// NewKey writes a new ed25519 key to dir/name (and name.pub). A non-empty
// passphrase encrypts the private key as ssh-keygen -N does.
func NewKey(tb testing.TB, dir, name, passphrase string) KeyPair {
	tb.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	var block *pem.Block
	if passphrase == "" {
		block, err = ssh.MarshalPrivateKey(priv, name)
	} else {
		block, err = ssh.MarshalPrivateKeyWithPassphrase(priv, name, []byte(passphrase))
	}
	if err != nil {
		tb.Fatal(err)
	}
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		tb.Fatal(err)
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp)))
	if err := os.WriteFile(path+".pub", []byte(line+" "+name+"\n"), 0o644); err != nil {
		tb.Fatal(err)
	}
	return KeyPair{Private: path, Public: sp, AuthorizedLine: line}
}

// SSHD is a running OpenSSH server.
type SSHD struct {
	*Proc
	Addr string // 127.0.0.1:port
	Host string // 127.0.0.1
	Port int
	Dir  string
	// User is the account tests log in as: the current user.
	User string
	// UserKey is authorized for User.
	UserKey KeyPair
	// HostKey is the server's host key.
	HostKey KeyPair
	// KnownHosts is a known_hosts file holding HostKey for Addr.
	KnownHosts string
	// Program is sshd's path; ConfigFile its sshd_config.
	Program, ConfigFile string
}

// SSHDOptions configure StartSSHD.
type SSHDOptions struct {
	// Forwarding allows TCP forwarding (direct-tcpip and tcpip-forward).
	// Zero: forwarding is forbidden, as on bastions that only allow
	// commands (netcat mode).
	Forwarding bool
	// Config is appended to the generated sshd_config. sshd takes the
	// first value of a keyword, so it can only add keywords.
	Config string
	// LogLevel is sshd's LogLevel. Zero: VERBOSE (logins). DEBUG1 also
	// logs each forwarding request.
	LogLevel string
}

// StartSSHD starts /usr/sbin/sshd -D -e on a free loopback port, with a
// generated host key and user key in a temporary folder. It needs root:
// sshd's privilege separation wants it, and CI runs as root.
func StartSSHD(tb testing.TB, o SSHDOptions) *SSHD {
	tb.Helper()
	s := PrepareSSHD(tb, o, "127.0.0.1", FreePort(tb))
	s.Proc = Start(tb, s.Program, "-D", "-e", "-f", s.ConfigFile)
	s.waitListening(tb, s.Addr)
	return s
}

// PrepareSSHD writes what an sshd listening on host:port needs (host
// key, user key, authorized_keys, known_hosts, sshd_config) and returns
// the server, not started: run s.Program -D -e -f s.ConfigFile where it
// must listen (in a lab host's namespace, say).
func PrepareSSHD(tb testing.TB, o SSHDOptions, host string, port int) *SSHD {
	tb.Helper()
	testenv.Root(tb, "for sshd (privilege separation, logging users in)")
	paths := testenv.Programs(tb, "sshd")
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil { // privilege separation; the package makes it at boot
		tb.Fatalf("sshd privilege separation folder: %v", err)
	}
	u, err := user.Current()
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	s := &SSHD{Dir: dir, User: u.Username, Host: host, Port: port, Program: paths[0]}
	s.Addr = net.JoinHostPort(s.Host, strconv.Itoa(s.Port))
	s.HostKey = NewKey(tb, dir, "ssh_host_ed25519_key", "")
	s.UserKey = NewKey(tb, dir, "id_ed25519", "")
	ak := filepath.Join(dir, "authorized_keys")
	if err := os.WriteFile(ak, []byte(s.UserKey.AuthorizedLine+"\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	s.KnownHosts = filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(s.KnownHosts, []byte(KnownHostsLine(s.Addr, s.HostKey.Public)), 0o600); err != nil {
		tb.Fatal(err)
	}
	if o.LogLevel == "" {
		o.LogLevel = "VERBOSE"
	}
	forwarding := "no"
	if o.Forwarding {
		forwarding = "yes"
	}
	s.ConfigFile = filepath.Join(dir, "sshd_config")
	text := fmt.Sprintf(`Port %d
ListenAddress %s
HostKey %s
PidFile none
AuthorizedKeysFile %s
StrictModes no
UsePAM no
PermitRootLogin yes
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AllowTcpForwarding %s
AllowStreamLocalForwarding no
AllowAgentForwarding no
X11Forwarding no
PermitTunnel no
GatewayPorts no
MaxSessions 64
MaxStartups 200
LogLevel %s
%s
`, s.Port, s.Host, s.HostKey.Private, ak, forwarding, o.LogLevel, o.Config)
	if err := os.WriteFile(s.ConfigFile, []byte(text), 0o600); err != nil {
		tb.Fatal(err)
	}
	return s
}

// KnownHostsLine is the known_hosts line for key at addr (host:port).
func KnownHostsLine(addr string, key ssh.PublicKey) string {
	host, port, _ := net.SplitHostPort(addr)
	name := host
	if port != "22" {
		name = "[" + host + "]:" + port
	}
	return name + " " + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key))) + "\n"
}

// SSHArgs are the OpenSSH client options that log in to the server with
// the user key, checking the host key, never asking anything.
func (s *SSHD) SSHArgs() []string {
	return []string{"-F", "/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-i", s.UserKey.Private,
		"-o", "UserKnownHostsFile=" + s.KnownHosts, "-o", "StrictHostKeyChecking=yes",
		"-o", "ExitOnForwardFailure=yes", "-p", strconv.Itoa(s.Port), "-l", s.User}
}

// StartDynamic runs ssh -N -D against the server: a SOCKS4, SOCKS4a and
// SOCKS5 server (no authentication) on a free loopback port, returned.
func (s *SSHD) StartDynamic(tb testing.TB) string {
	tb.Helper()
	paths := testenv.Programs(tb, "ssh")
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(tb)))
	args := append(s.SSHArgs(), "-N", "-D", addr, s.Host)
	p := Start(tb, paths[0], args...)
	p.waitListening(tb, addr)
	return addr
}

// StartLocalForward runs ssh -N -L from a free loopback port to to, which
// the server dials; it returns the local address.
func (s *SSHD) StartLocalForward(tb testing.TB, to string, extra ...string) (*Proc, string) {
	tb.Helper()
	paths := testenv.Programs(tb, "ssh")
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(tb)))
	args := append(append(s.SSHArgs(), extra...), "-N", "-L", addr+":"+to, s.Host)
	p := Start(tb, paths[0], args...)
	p.waitListening(tb, addr)
	return p, addr
}

// Dante is a running dante SOCKS5 server.
type Dante struct {
	*Proc
	Addr           string
	User, Password string
	// BlockedPort is a port on 127.0.0.1 the server refuses to connect
	// to ("not allowed by ruleset").
	BlockedPort int
}

// StartDante runs danted on a free loopback port. With auth, clients
// must authenticate with a user name and password (socksmethod username);
// dante checks them against the system's password database, so a
// throwaway system user with a random password is created (useradd,
// chpasswd) and removed at cleanup. That needs root.
func StartDante(tb testing.TB, auth bool) *Dante {
	tb.Helper()
	paths := testenv.Programs(tb, "danted")
	method := "none"
	d := &Dante{BlockedPort: 9}
	if auth {
		testenv.Root(tb, "for dante's password check (a throwaway system user)")
		testenv.Programs(tb, "useradd", "chpasswd", "userdel")
		d.User, d.Password = addUser(tb)
		method = "username"
	}
	dir := tb.TempDir()
	port := FreePort(tb)
	d.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	unpriv := "nobody"
	if os.Geteuid() != 0 {
		unpriv = "" // only root can switch users
	}
	var users string
	if unpriv != "" {
		users = "user.privileged: root\nuser.unprivileged: " + unpriv + "\n"
	}
	conf := filepath.Join(dir, "danted.conf")
	text := fmt.Sprintf(`logoutput: stderr
internal: 127.0.0.1 port = %d
external: 127.0.0.1
socksmethod: %s
clientmethod: none
%s
client pass {
  from: 127.0.0.0/8 to: 0.0.0.0/0
}
socks block {
  from: 0.0.0.0/0 to: 127.0.0.1/32 port = %d
  log: error
}
socks pass {
  from: 127.0.0.0/8 to: 0.0.0.0/0
  command: connect
  socksmethod: %s
  log: error
}
`, port, method, users, d.BlockedPort, method)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		tb.Fatal(err)
	}
	d.Proc = Start(tb, paths[0], "-f", conf, "-N", "1", "-p", filepath.Join(dir, "danted.pid"))
	d.waitListening(tb, d.Addr)
	return d
}

var userMu sync.Mutex

// addUser creates a system user with no home and no shell, for dante's
// username method, and removes it at cleanup.
func addUser(tb testing.TB) (name, password string) {
	tb.Helper()
	var b [6]byte
	rand.Read(b[:])
	name = "vlt" + hex.EncodeToString(b[:])
	rand.Read(b[:])
	password = "pw-" + hex.EncodeToString(b[:])
	userMu.Lock()
	defer userMu.Unlock()
	// Other test binaries may be editing /etc/passwd at the same moment:
	// useradd then fails to take its lock, so try again for a while.
	var out []byte
	var err error
	for i := 0; i < 50; i++ {
		out, err = exec.Command("useradd", "-M", "-N", "-s", "/usr/sbin/nologin", name).CombinedOutput()
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		tb.Fatalf("useradd %s: %v: %s", name, err, out)
	}
	tb.Cleanup(func() {
		for i := 0; i < 50; i++ {
			if out, err := exec.Command("userdel", name).CombinedOutput(); err == nil {
				return
			} else if i == 49 {
				tb.Errorf("userdel %s: %v: %s", name, err, out)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	for i := 0; i < 50; i++ {
		cmd := exec.Command("chpasswd")
		cmd.Stdin = strings.NewReader(name + ":" + password + "\n")
		if out, err = cmd.CombinedOutput(); err == nil {
			return name, password
		}
		time.Sleep(100 * time.Millisecond)
	}
	tb.Fatalf("chpasswd for %s: %v: %s", name, err, out)
	return "", ""
}

// TinyproxyOptions configure StartTinyproxy.
type TinyproxyOptions struct {
	// User and Password, if set, are required with basic authentication.
	User, Password string
	// ConnectPorts, if any, are the only ports CONNECT may reach; zero
	// allows every port.
	ConnectPorts []int
}

// StartTinyproxy runs tinyproxy -d as an HTTP CONNECT proxy on a free
// loopback port and returns its address.
func StartTinyproxy(tb testing.TB, o TinyproxyOptions) (*Proc, string) {
	tb.Helper()
	paths := testenv.Programs(tb, "tinyproxy")
	dir := tb.TempDir()
	port := FreePort(tb)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	var b strings.Builder
	fmt.Fprintf(&b, "Port %d\nListen 127.0.0.1\nTimeout 60\nMaxClients 200\nAllow 127.0.0.1\nLogLevel Info\n", port)
	if os.Geteuid() == 0 {
		b.WriteString("User nobody\nGroup nogroup\n")
	}
	if o.User != "" {
		fmt.Fprintf(&b, "BasicAuth %s %s\n", o.User, o.Password)
	}
	for _, p := range o.ConnectPorts {
		fmt.Fprintf(&b, "ConnectPort %d\n", p)
	}
	conf := filepath.Join(dir, "tinyproxy.conf")
	if err := os.WriteFile(conf, []byte(b.String()), 0o644); err != nil {
		tb.Fatal(err)
	}
	p := Start(tb, paths[0], "-d", "-c", conf)
	p.waitListening(tb, addr)
	return p, addr
}
