//go:build linux

package integration

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// sshLayer is the ssh layer's text for a test sshd, with extra parameters.
func sshLayer(s *realserver.SSHD, extra ...string) string {
	p := []string{"host=" + s.Host, fmt.Sprintf("port=%d", s.Port), "user=" + s.User, "identity=" + s.UserKey.Private,
		"known-hosts=" + s.KnownHosts, "agent=false", "config=none"}
	return "ssh:" + strings.Join(append(p, extra...), ",")
}

// webFile serves a generated file with python3's http.server and returns
// the server's address and the file's SHA-256.
func webFile(t *testing.T, size int) (addr, want string) {
	t.Helper()
	testenv.Programs(t, "curl", "python3")
	dir := t.TempDir()
	data := genData(size, 4)
	if err := os.WriteFile(filepath.Join(dir, "data.bin"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	_, addr = startHTTPServer(t, dir)
	return addr, testnet.Sum(data)
}

// curlGet downloads url with curl and its extra options and checks what
// it saved.
func curlGet(t *testing.T, want string, url string, opts ...string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "got.bin")
	args := append([]string{"-sS", "--fail", "--max-time", "60", "-o", out}, opts...)
	_, stderr, err := run(90*time.Second, nil, "curl", append(args, url)...)
	if err != nil {
		t.Fatalf("curl %v %s: %v: %s", opts, url, err, stderr)
	}
	if got, n := fileSum(t, out); got != want {
		t.Fatalf("curl %v saved %d bytes with another SHA-256", opts, n)
	}
}

// TestSocksOverSSH is the README's example: curl speaks SOCKS to vlink
// socks, whose stack goes through a real sshd; the name "localhost" is
// resolved by the SSH server, not here.
func TestSocksOverSSH(t *testing.T) {
	web, want := webFile(t, 8<<20)
	_, port := splitPort(t, web)
	s := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true, LogLevel: "DEBUG1"})
	socks, addr := startVLink(t, "socks", "--stack", sshLayer(s), "--log-level", "debug")
	for _, opt := range []string{"--socks5-hostname", "--socks4a", "--socks5", "--socks4"} {
		curlGet(t, want, "http://localhost:"+port+"/data.bin", opt, addr)
	}
	// sshd opened every tunnel, over one SSH connection.
	if n := strings.Count(s.Output(), "Accepted publickey"); n != 1 {
		t.Errorf("sshd logged %d logins for 4 downloads, want 1", n)
	}
	if !strings.Contains(s.Output(), "target localhost port "+port) {
		t.Errorf("sshd did not resolve the name: no direct-tcpip to localhost:%s in its log", port)
	}
	socks.WaitFor(t, regexp.MustCompile(`msg=connection .*socks=socks5 dest=localhost:`+port), 5*time.Second)
}

// TestTunnelThroughProxies carries curl's downloads through vlink tunnel
// over each factory against its real server: ssh (forward and netcat),
// socks5 with dante's username authentication, socks4a with ssh -D, and
// http with tinyproxy's basic authentication.
func TestTunnelThroughProxies(t *testing.T) {
	web, want := webFile(t, 8<<20)
	_, port := splitPort(t, web)
	fwd := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true})
	noFwd := realserver.StartSSHD(t, realserver.SSHDOptions{})
	dante := realserver.StartDante(t, true)
	_, tiny := realserver.StartTinyproxy(t, realserver.TinyproxyOptions{User: "bob", Password: "tinypw"})
	dynamic := fwd.StartDynamic(t)
	// The passwords reach vlink through files only it can read.
	dir := t.TempDir()
	dantePW := filepath.Join(dir, "dante.pw")
	tinyPW := filepath.Join(dir, "tiny.pw")
	os.WriteFile(dantePW, []byte(dante.Password+"\n"), 0o600)
	os.WriteFile(tinyPW, []byte("tinypw\n"), 0o600)

	for _, tc := range []struct{ name, stack string }{
		{"ssh", sshLayer(fwd)},
		{"ssh-netcat", sshLayer(noFwd, "mode=netcat")},
		{"socks5-dante", fmt.Sprintf("socks5:addr=%s,user=%s,password-file=%s", dante.Addr, dante.User, dantePW)},
		{"socks4a-ssh-D", "socks4a:addr=" + dynamic},
		{"http-tinyproxy", fmt.Sprintf("http:addr=%s,user=bob,password-file=%s", tiny, tinyPW)},
		{"ssh-over-socks5", sshLayer(fwd, "share=false") + fmt.Sprintf("+socks5:addr=%s,user=%s,password-file=%s", dante.Addr, dante.User, dantePW)},
		// Proxy URLs as users paste them, passwords and all.
		{"socks5h-url-dante", (&url.URL{Scheme: "socks5h", User: url.UserPassword(dante.User, dante.Password), Host: dante.Addr}).String()},
		{"http-url-tinyproxy", (&url.URL{Scheme: "http", User: url.UserPassword("bob", "tinypw"), Host: tiny}).String()},
		{"socks4a-url-ssh-D", "socks4a://" + dynamic},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tun, addr := startVLink(t, "tunnel", "--to", "localhost:"+port, "--stack", tc.stack)
			curlGet(t, want, "http://"+addr+"/data.bin")
			curlGet(t, want, "http://"+addr+"/data.bin")
			if s := tun.Output(); strings.Contains(s, dante.Password) || strings.Contains(s, "tinypw") {
				t.Fatalf("vlink logged a password:\n%s", s)
			}
			if strings.Contains(tc.stack, "://") && strings.Contains(tc.stack, "@") && !strings.Contains(tun.Output(), "holds a password") {
				t.Errorf("no warning about the password on the command line:\n%s", tun.Output())
			}
		})
	}
}

// TestReverseTunnel publishes a local web server on an SSH server's side
// (ssh -R): vlink tunnel --listen-stack asks sshd to listen, and curl
// reaches the server through sshd's port.
func TestReverseTunnel(t *testing.T) {
	web, want := webFile(t, 4<<20)
	s := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true})
	_, addr := startVLink(t, "tunnel", "--listen-stack", sshLayer(s), "--to", web, "--stack", "tcp")
	if addr == "127.0.0.1:0" {
		t.Fatal("the tunnel did not log the port sshd chose")
	}
	curlGet(t, want, "http://"+addr+"/data.bin")
	curlGet(t, want, "http://"+addr+"/data.bin")
}

// TestProxyErrors checks what a user sees when a hop fails: the log
// names the hop and the reason, curl gets a failure, nothing else breaks.
func TestProxyErrors(t *testing.T) {
	web, _ := webFile(t, 1<<10)
	s := realserver.StartSSHD(t, realserver.SSHDOptions{Forwarding: true})
	dante := realserver.StartDante(t, true)
	other := realserver.NewKey(t, t.TempDir(), "other", "")
	changed := filepath.Join(t.TempDir(), "known_hosts")
	os.WriteFile(changed, []byte(realserver.KnownHostsLine(s.Addr, other.Public)), 0o600)
	badPW := filepath.Join(t.TempDir(), "bad.pw")
	os.WriteFile(badPW, []byte("wrong\n"), 0o600)
	for _, tc := range []struct {
		name, stack string
		log         *regexp.Regexp
	}{
		{"host key changed", strings.Replace(sshLayer(s), "known-hosts="+s.KnownHosts, "known-hosts="+changed, 1),
			regexp.MustCompile(`HOST KEY CHANGED for \[127\.0\.0\.1\]:` + fmt.Sprint(s.Port) + `: the server offers ssh-ed25519 SHA256:`)},
		{"wrong password", fmt.Sprintf("socks5:addr=%s,user=%s,password-file=%s", dante.Addr, dante.User, badPW),
			regexp.MustCompile(`dial socks5 ` + regexp.QuoteMeta(dante.Addr) + `: .*authentication failed: ` + regexp.QuoteMeta(`the user name and password were rejected`))},
		{"destination refused", fmt.Sprintf("socks5:addr=%s", s.StartDynamic(t)),
			regexp.MustCompile(`dial socks5 127\.0\.0\.1:\d+: connect to 127\.0\.0\.1:1: the proxy closed the connection`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			to := web
			if tc.name == "destination refused" {
				to = "127.0.0.1:1"
			}
			tun, addr := startVLink(t, "tunnel", "--to", to, "--stack", tc.stack)
			if _, _, err := run(30*time.Second, nil, "curl", "-sS", "--fail", "--max-time", "20", "http://"+addr+"/"); err == nil {
				t.Fatal("curl succeeded")
			}
			tun.WaitFor(t, tc.log, 10*time.Second)
		})
	}
}

func splitPort(t *testing.T, addr string) (string, string) {
	t.Helper()
	i := strings.LastIndexByte(addr, ':')
	return addr[:i], addr[i+1:]
}
