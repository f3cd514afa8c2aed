package layers_test

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/vlink-dev/vlink/factories/socks"
	"github.com/vlink-dev/vlink/factories/ssh"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink"
)

// The proxy and SSH factories are tested through real servers where the
// programs are installed (always in CI): sshd for ssh, ssh -D for socks4
// and socks4a, dante for socks5 (conformance_proxies_linux_test.go).
// Elsewhere they fall back to Go servers: x/crypto/ssh's server side,
// vlink's own SOCKS front end. The http layer always uses the Go CONNECT
// proxy below: tinyproxy ends both directions when one ends, so it cannot
// carry the half-closes these tests make (the http factory's own tests
// run it against tinyproxy).
func init() {
	// SSH channels have no reset: whatever ended the channel, the
	// server closes its target with a FIN (and a reset from the target
	// ends the channel with an EOF), so an abort arrives as a clean end.
	fixtures["ssh"] = func(t *testing.T) (vlink.Stack, bool) {
		t.Cleanup(ssh.CloseAll)
		if st, ok := realFixture(t, "ssh"); ok {
			return st, true
		}
		return goSSHServer(t), true
	}
	// ssh -D, the real SOCKS4 server, is an SSH client: its channels
	// lose aborts as above. Dante and the Go server carry them.
	for _, name := range []string{"socks4", "socks4a", "socks5"} {
		fixtures[name] = func(t *testing.T) (vlink.Stack, bool) {
			if st, ok := realFixture(t, name); ok {
				return st, name != "socks5"
			}
			return vlink.MustParse(name + ":addr=" + goSOCKSServer(t)), false
		}
	}
	fixtures["http"] = func(t *testing.T) (vlink.Stack, bool) {
		return vlink.MustParse("http:addr=" + goConnectProxy(t)), false
	}
}

// serve runs handle on each connection l accepts until the test ends.
func serve(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				handle(c)
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			}()
		}
	}()
	return l.Addr().String()
}

// goSOCKSServer is vlink's SOCKS front end, dialing directly.
func goSOCKSServer(t *testing.T) string {
	srv := &socks.Server{Dialer: &net.Dialer{}}
	return serve(t, func(c net.Conn) {
		out, _, err := srv.Handshake(context.Background(), c)
		if err != nil {
			c.Close()
			return
		}
		netconn.Relay(c, out)
		c.Close()
		out.Close()
	})
}

// goConnectProxy is an HTTP CONNECT proxy that keeps half-closes.
func goConnectProxy(t *testing.T) string {
	return serve(t, func(c net.Conn) {
		defer c.Close()
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil || req.Method != http.MethodConnect {
			return
		}
		out, err := net.Dial("tcp", req.RequestURI)
		if err != nil {
			io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
			return
		}
		defer out.Close()
		io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
		netconn.Relay(netconn.Prefixed(c, peek(br)), out)
	})
}

func peek(br *bufio.Reader) []byte {
	b, _ := br.Peek(br.Buffered())
	return b
}

// goSSHServer is an SSH server from x/crypto/ssh that serves direct-tcpip
// channels, with a host key and a user key made for the test.
func goSSHServer(t *testing.T) vlink.Stack {
	dir := t.TempDir()
	_, hostPriv, _ := ed25519.GenerateKey(rand.Reader)
	hostSigner, err := gossh.NewSignerFromKey(hostPriv)
	if err != nil {
		t.Fatal(err)
	}
	userPub, userPriv, _ := ed25519.GenerateKey(rand.Reader)
	block, err := gossh.MarshalPrivateKey(userPriv, "")
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "id")
	os.WriteFile(keyFile, pem.EncodeToMemory(block), 0o600)
	authorized, _ := gossh.NewPublicKey(userPub)
	cfg := &gossh.ServerConfig{PublicKeyCallback: func(_ gossh.ConnMetadata, k gossh.PublicKey) (*gossh.Permissions, error) {
		if string(k.Marshal()) == string(authorized.Marshal()) {
			return nil, nil
		}
		return nil, fmt.Errorf("unknown key")
	}}
	cfg.AddHostKey(hostSigner)
	addr := serve(t, func(c net.Conn) {
		defer c.Close()
		sc, chans, reqs, err := gossh.NewServerConn(c, cfg)
		if err != nil {
			return
		}
		defer sc.Close()
		go gossh.DiscardRequests(reqs)
		var wg sync.WaitGroup
		defer wg.Wait()
		for nc := range chans {
			if nc.ChannelType() != "direct-tcpip" {
				nc.Reject(gossh.UnknownChannelType, "direct-tcpip only")
				continue
			}
			var d struct {
				Host  string
				Port  uint32
				OHost string
				OPort uint32
			}
			if gossh.Unmarshal(nc.ExtraData(), &d) != nil {
				nc.Reject(gossh.ConnectionFailed, "bad request")
				continue
			}
			out, err := net.Dial("tcp", net.JoinHostPort(d.Host, strconv.Itoa(int(d.Port))))
			if err != nil {
				nc.Reject(gossh.ConnectionFailed, err.Error())
				continue
			}
			ch, creqs, err := nc.Accept()
			if err != nil {
				out.Close()
				continue
			}
			go gossh.DiscardRequests(creqs)
			var both sync.WaitGroup
			both.Add(2)
			go func() { // channel -> destination
				defer both.Done()
				io.Copy(out, ch)
				out.(*net.TCPConn).CloseWrite()
			}()
			go func() { // destination -> channel
				defer both.Done()
				io.Copy(ch, out)
				ch.CloseWrite()
			}()
			wg.Add(1)
			go func() {
				defer wg.Done()
				both.Wait()
				out.Close()
				ch.Close()
			}()
		}
	})
	kh := filepath.Join(dir, "known_hosts")
	host, port, _ := net.SplitHostPort(addr)
	os.WriteFile(kh, []byte(fmt.Sprintf("[%s]:%s %s", host, port, gossh.MarshalAuthorizedKey(hostSigner.PublicKey()))), 0o600)
	return vlink.MustParse(fmt.Sprintf("ssh:host=%s,port=%s,user=test,identity=%s,known-hosts=%s,agent=false,config=none", host, port, keyFile, kh))
}
