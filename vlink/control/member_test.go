package control

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/filters/noise"
	"github.com/vlink-dev/vlink/internal/testmember"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/nodecert"
)

// tap is a TCP forwarder in front of a relay, standing for the relay's
// own view of the wire: it records every byte nodes send through it and,
// with flipAt, flips one bit at that offset of each connection's stream
// toward the relay that gets so far (only relayed bulk data does: control
// connections carry a few hundred bytes).
type tap struct {
	ln     net.Listener
	to     string
	flipAt int64

	mu   sync.Mutex
	seen bytes.Buffer
	wg   sync.WaitGroup
}

func startTap(t *testing.T, to string, flipAt int64) *tap {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tp := &tap{ln: ln, to: to, flipAt: flipAt}
	tp.wg.Add(1)
	go func() {
		defer tp.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tp.wg.Add(1)
			go func() { defer tp.wg.Done(); tp.forward(c) }()
		}
	}()
	t.Cleanup(func() { ln.Close(); tp.wg.Wait() })
	return tp
}

func (tp *tap) forward(c net.Conn) {
	defer c.Close()
	up, err := net.Dial("tcp", tp.to)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{})
	go func() {
		io.Copy(c, up)
		c.(*net.TCPConn).CloseWrite()
		close(done)
	}()
	buf := make([]byte, 32<<10)
	var off int64
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if tp.flipAt > 0 && off <= tp.flipAt && tp.flipAt < off+int64(n) {
				buf[tp.flipAt-off] ^= 0x10
			}
			off += int64(n)
			tp.mu.Lock()
			tp.seen.Write(buf[:n])
			tp.mu.Unlock()
			if _, err := up.Write(buf[:n]); err != nil {
				break
			}
		}
		if err != nil {
			up.(*net.TCPConn).CloseWrite()
			break
		}
	}
	<-done
}

func (tp *tap) contains(b []byte) bool {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return bytes.Contains(tp.seen.Bytes(), b)
}

// pathsOnly dials nodes by the given paths only.
type pathsOnly struct {
	n     *Node
	paths Paths
}

func (p pathsOnly) DialNode(ctx context.Context, name string, port uint16) (net.Conn, error) {
	c, err := p.n.DialPaths(ctx, name, port, p.paths)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// sumOf sends payload to sumServer's port on bob through d, and returns
// what comes back: its checksum, if all went well.
func sumOf(t *testing.T, d *vlink.Dialer, payload []byte) ([]byte, error) {
	t.Helper()
	c, err := d.DialContext(ctxT(t), "tcp", "bob.vlink.alt:5432")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go func() { c.Write(payload); c.(interface{ CloseWrite() error }).CloseWrite() }()
	return io.ReadAll(c)
}

// startMemberRelay starts a relay with a relay's certificate of n.
func startMemberRelay(t *testing.T, n *testmember.Network) *testRelay {
	t.Helper()
	return startRelay(t, RelayConfig{Member: n.Member("relay", nodecert.KindRelay)}, "")
}

// memberNode connects the member m to the relay at addr.
func memberNode(t *testing.T, relay string, m *vlink.Member) *Node {
	t.Helper()
	return connect(t, relay, "", func(c *Config) { c.Key, c.Member = nil, m })
}

// sumServer serves n's port 5432 as a member: it answers each
// connection's bytes with their SHA-256, and reports each read error.
func sumServer(t *testing.T, n *Node, m *vlink.Member) <-chan error {
	t.Helper()
	policy := vlink.Policy{Member: m, Targets: []selector.Rule{{Host: "localhost", Ports: "5432", Action: selector.Direct}}}
	nl, err := n.Listen(func(from string, port uint16) error {
		return policy.AllowsTarget(net.JoinHostPort("localhost", strconv.Itoa(int(port))))
	})
	if err != nil {
		t.Fatal(err)
	}
	l, err := (&vlink.ListenConfig{Policy: policy}).NewListener(nl)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 16)
	testnet.Serve(t, l, func(c net.Conn) {
		data, err := io.ReadAll(c)
		errs <- err
		if err == nil {
			sum := sha256.Sum256(data)
			c.Write(sum[:])
		}
	})
	return errs
}

// A relay between members carries ciphertext it holds no key for: the
// bytes it sees hold no trace of the payload, and one bit it flips
// reaches the applications as an error, never as other data.
func TestMembersThroughRelay(t *testing.T) {
	n := testmember.New(t)
	r := startMemberRelay(t, n)
	aliceM, bobM := n.Member("alice", nodecert.KindNode), n.Member("bob", nodecert.KindNode)
	marker := []byte("a payload the relay must never see, ")
	payload := bytes.Repeat(marker, (1<<20)/len(marker))
	rand.Read(payload[len(payload)/2:])

	for _, tt := range []struct {
		name   string
		flipAt int64
	}{
		{"recorded", 0},
		{"one bit flipped", 256 << 10},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tp := startTap(t, r.addr, tt.flipAt)
			alice, bob := memberNode(t, tp.ln.Addr().String(), aliceM), memberNode(t, tp.ln.Addr().String(), bobM)
			errs := sumServer(t, bob, bobM)
			d := &vlink.Dialer{Stack: vlink.MustParse("zstd"), Network: pathsOnly{alice, PathRelay}, Member: aliceM}
			defer d.Close()
			got, err := sumOf(t, d, payload)
			want := sha256.Sum256(payload)
			if tt.flipAt == 0 {
				if err != nil || !bytes.Equal(got, want[:]) {
					t.Fatalf("bob's checksum %x (%v), want %x", got, err, want)
				}
				if berr := <-errs; berr != nil {
					t.Fatalf("bob read: %v", berr)
				}
				if tp.contains(marker[:24]) {
					t.Fatal("the relay's wire carries the payload in clear")
				}
				return
			}
			if berr := <-errs; !errors.Is(berr, noise.ErrAuth) {
				t.Fatalf("bob read: %v, want noise.ErrAuth", berr)
			}
			if err == nil {
				t.Fatalf("alice read %x and no error, though a bit was flipped on the way", got)
			}
		})
	}
}

// Who may register, and who a node takes for its relay.
func TestMemberRegistration(t *testing.T) {
	n := testmember.New(t)
	r := startMemberRelay(t, n)
	t.Run("a relay's certificate does not register as a node", func(t *testing.T) {
		m := n.Member("other-relay", nodecert.KindRelay)
		_, err := Connect(ctxT(t), Config{Member: m, Relays: []string{r.addr}})
		if err == nil || !strings.Contains(err.Error(), "a node needs a node's") {
			t.Fatalf("Connect = %v, want the certificate's kind refused", err)
		}
		d := RelayDialer(Config{Member: m}, nil)
		c, err := d.DialContext(ctxT(t), "tcp", r.addr)
		if err == nil {
			c.Write((&frame{op: opAdvertise}).append(nil))
			_, err = readFrame(c)
			c.Close()
		}
		if err == nil {
			t.Fatal("the relay registered a relay's certificate as a node")
		}
		if got := r.Stats().FailedLogins[LoginRefused]; got == 0 {
			t.Fatalf("failed logins %v, want a refusal counted", r.Stats().FailedLogins)
		}
	})
	t.Run("a node takes no node for its relay", func(t *testing.T) {
		impostor := &vlink.ListenConfig{Policy: vlink.Policy{Member: n.Member("mallory", nodecert.KindNode), Plain: vlink.PlainRefuse}}
		l, err := impostor.Listen(context.Background(), "tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		fake, _ := NewRelay(RelayConfig{})
		done := make(chan error, 1)
		go func() { done <- fake.Serve(l) }()
		defer func() { fake.Close(); <-done }()
		_, err = Connect(ctxT(t), Config{Member: n.Member("alice", nodecert.KindNode), Relays: []string{l.Addr().String()}})
		if !errors.Is(err, vlink.ErrAuth) || !strings.Contains(err.Error(), "not a relay of this network") {
			t.Fatalf("Connect = %v, want the impostor refused as no relay", err)
		}
	})
	t.Run("another network's member", func(t *testing.T) {
		_, err := Connect(ctxT(t), Config{Member: testmember.New(t).Member("alice", nodecert.KindNode), Relays: []string{r.addr}})
		if !errors.Is(err, vlink.ErrRefused) || !strings.Contains(err.Error(), "certificate refused") {
			t.Fatalf("Connect = %v, want the certificate refused", err)
		}
	})
	t.Run("a network key with a certificate", func(t *testing.T) {
		if _, err := r.Listen(context.Background(), "127.0.0.1:0", networkKey); err == nil {
			t.Fatal("a relay with a certificate took a network key too")
		}
	})
}

// A name is bound to the key that holds it while its holder lives: a
// second certificate for the same name (the owner signed two) waits,
// with the reason in its error, and the holder keeps its name; the same
// key registering again (a restart) takes it over at once.
func TestMemberNameHeld(t *testing.T) {
	n := testmember.New(t)
	r := startMemberRelay(t, n)
	db := n.Member("db", nodecert.KindNode)
	holder := memberNode(t, r.addr, db)
	echo(holder)

	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	_, err := Connect(ctx, Config{Member: n.Member("db", nodecert.KindNode), Relays: []string{r.addr}})
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "live, with another key (certificate "+db.Cert.Fingerprint()) {
		t.Fatalf("a second key for db: %v, want it told db is held by %s", err, db.Cert.Fingerprint())
	}
	// The holder still answers as db.
	alice := memberNode(t, r.addr, n.Member("alice", nodecert.KindNode))
	c := alice.Cooperate(Expect{From: "db", Type: typeReply})
	if err := c.Send(ctxT(t), "db", typeEcho, []byte("still you?")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctxT(t)); err != nil {
		t.Fatalf("db did not answer after the attempt to take its name: %v", err)
	}

	restarted := memberNode(t, r.addr, db) // same key: takes the name over
	if got := restarted.Name(); got != "db" {
		t.Fatalf("restarted node is %q", got)
	}
}
