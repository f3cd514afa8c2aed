package vlink_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testmember"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/nodecert"
)

// memberListen starts an echoing listener with policy p and reports the
// hello of each connection it hands out.
func memberListen(t *testing.T, p vlink.Policy) (*vlink.Listener, <-chan *vlink.Hello) {
	t.Helper()
	l, err := (&vlink.ListenConfig{Policy: p}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l, serveHellos(t, l)
}

func serveHellos(t *testing.T, l net.Listener) <-chan *vlink.Hello {
	hellos := make(chan *vlink.Hello, 16)
	testnet.Serve(t, l, func(c net.Conn) {
		hellos <- c.(*vlink.Conn).Hello()
		testnet.Echo(c)
	})
	return hellos
}

func nextHello(t *testing.T, hellos <-chan *vlink.Hello) *vlink.Hello {
	t.Helper()
	select {
	case h := <-hellos:
		return h
	case <-time.After(10 * time.Second):
		t.Fatal("the listener handed out no connection")
		return nil
	}
}

// Members reach each other by certificate alone: no key is shared, the
// listener learns the dialer's name from its certificate, whatever the
// stack, with the encryption layer below the multi-link layers.
func TestMemberAccepted(t *testing.T) {
	n := testmember.New(t)
	alice, gw := n.Member("alice", nodecert.KindNode), n.Member("gw", nodecert.KindNode)
	l, hellos := memberListen(t, vlink.Policy{Member: gw})
	for _, stack := range []string{"noise", "test-xor+noise", "mux+noise", "test-xor+mux+noise", "test-xor"} {
		t.Run(stack, func(t *testing.T) {
			var peer *nodecert.Certificate
			d := &vlink.Dialer{Stack: vlink.MustParse(stack), Member: alice, PeerCert: func(_ string, c *nodecert.Certificate) error {
				peer = c
				return nil
			}}
			defer d.Close()
			c, err := d.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			testnet.RoundTrip(t, c, 100<<10+3)
			h := nextHello(t, hellos)
			if h.Node != "alice" || h.Cert == nil || h.Cert.Fingerprint() != alice.Cert.Fingerprint() || !h.Authenticated {
				t.Fatalf("Hello: node %q, cert %v, authenticated %v; want alice's", h.Node, h.Cert, h.Authenticated)
			}
			if peer == nil || peer.Name() != "gw" {
				t.Fatalf("the dialer saw the listener's certificate %v, want gw's", peer)
			}
			// A plain stack gets the encryption layer: it proves the
			// certificates, loopback or not.
			if stack == "test-xor" && (len(h.Stack.Layers) != 2 || h.Stack.Layers[1].Name != vlink.EncryptionLayer) {
				t.Fatalf("stack %s arrived as %s, want the encryption layer added below", stack, h.Stack)
			}
		})
	}
}

// What a member refuses, and the error each side sees; the listener hands
// out none of the refused connections.
func TestMemberRefused(t *testing.T) {
	n, other := testmember.New(t), testmember.New(t)
	alice := n.Member("alice", nodecert.KindNode)
	stranger := other.Member("alice", nodecert.KindNode) // same name, another owner
	revokedAlice := n.Member("alice", nodecert.KindNode)
	revoking := n.Revoking(revokedAlice.Cert)
	gw := n.Member("gw", nodecert.KindNode)
	gwRevoking := *gw
	gwRevoking.Trust = revoking
	tests := []struct {
		name    string
		policy  vlink.Policy
		dialer  *vlink.Member
		stack   string
		is      error // what the dial error matches
		code    vlink.RefuseCode
		mention string
	}{
		{"another owner's certificate", vlink.Policy{Member: gw}, stranger, "noise", vlink.ErrAuth, vlink.CodeAuthFailed, "certificate refused"},
		{"revoked", vlink.Policy{Member: &gwRevoking}, revokedAlice, "noise", vlink.ErrAuth, vlink.CodeAuthFailed, "revoked"},
		{"listener not a member", vlink.Policy{}, alice, "noise", vlink.ErrAuth, vlink.CodeAuthRequired, "checks no certificate"},
		{"listener with a key only", vlink.Policy{Key: key}, alice, "noise", vlink.ErrAuth, vlink.CodeAuthRequired, "checks no certificate"},
		{"listener of another network", vlink.Policy{Member: other.Member("gw", nodecert.KindNode)}, alice, "noise", vlink.ErrAuth, vlink.CodeAuthFailed, "certificate refused"},
		{"encryption above mux", vlink.Policy{Member: gw}, alice, "noise+mux", vlink.ErrBadStack, 0, "below the multi-link layers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, hellos := memberListen(t, tt.policy)
			d := &vlink.Dialer{Stack: vlink.MustParse(tt.stack), Member: tt.dialer}
			defer d.Close()
			c, err := d.Dial("tcp", l.Addr().String())
			if err == nil {
				c.Close()
				t.Fatal("dial succeeded")
			}
			var re *vlink.RefusedError
			if !errors.Is(err, tt.is) || (tt.code != 0) != errors.As(err, &re) || tt.code != 0 && re.Code != tt.code {
				t.Fatalf("err = %v, want one matching %v with refusal code %v", err, tt.is, tt.code)
			}
			if !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("err = %q, want it to mention %q", err, tt.mention)
			}
			select {
			case h := <-hellos:
				t.Fatalf("the listener handed out a connection from %q", h.Node)
			case <-time.After(50 * time.Millisecond):
			}
		})
	}
}

// A member whose key is not its certificate's, or whose certificate its
// own trust refuses, fails before dialing, saying why.
func TestMemberInvalid(t *testing.T) {
	n := testmember.New(t)
	alice := n.Member("alice", nodecert.KindNode)
	l, _ := memberListen(t, vlink.Policy{Member: n.Member("gw", nodecert.KindNode)})
	wrongKey := *alice
	wrongKey.Private = vlink.NewIdentity()
	foreign := *alice
	foreign.Trust = testmember.New(t).Trust
	for _, tt := range []struct {
		name    string
		m       *vlink.Member
		mention string
	}{
		{"key not the certificate's", &wrongKey, "vlink key --pub"},
		{"certificate of another owner", &foreign, "its own certificate"},
		{"no certificate", &vlink.Member{Private: alice.Private, Trust: n.Trust}, "no certificate"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := &vlink.Dialer{Stack: vlink.MustParse("noise"), Member: tt.m}
			_, err := d.Dial("tcp", l.Addr().String())
			if !errors.Is(err, vlink.ErrNotMember) || !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("err = %v, want ErrNotMember mentioning %q", err, tt.mention)
			}
			if err := (&vlink.Policy{Member: tt.m}).Validate(); !errors.Is(err, vlink.ErrNotMember) {
				t.Fatalf("Policy.Validate = %v, want ErrNotMember", err)
			}
		})
	}
}

// A listener that presents a certificate whose key it does not hold
// (here, swapped after the listener checked it) is caught by the
// encryption layer: it cannot read the dialer's first KK message, so
// the handshake ends there, before a byte of the application's.
func TestMemberListenerMustHoldKey(t *testing.T) {
	n := testmember.New(t)
	alice, gw := n.Member("alice", nodecert.KindNode), n.Member("gw", nodecert.KindNode)
	l, _ := memberListen(t, vlink.Policy{Member: gw})
	gw.Private = vlink.NewIdentity() // presents gw's certificate, holds another key
	d := &vlink.Dialer{Stack: vlink.MustParse("noise"), Member: alice}
	c, err := d.Dial("tcp", l.Addr().String())
	if err == nil {
		c.Close()
		t.Fatal("dial succeeded against a listener that does not hold its certificate's key")
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), "certificate's key") {
		t.Fatalf("err = %v, want the handshake cut, asking whether the peer holds its certificate's key", err)
	}
}

// vouchedConn is a connection a network says comes from (or goes to)
// peer, with the key its relay made for it.
type vouchedConn struct {
	net.Conn
	peer string
	key  []byte
}

func (c *vouchedConn) VouchedPeer() string  { return c.peer }
func (c *vouchedConn) UnwrapConn() net.Conn { return c.Conn }
func (c *vouchedConn) CloseWrite() error    { return netconn.CloseWrite(c.Conn) }
func (c *vouchedConn) VouchedKey() []byte   { return c.key }

// fakeNetwork is a relay under the test's control: each DialNode
// connects to the listener at addr, and tells it the dialer is from.
type fakeNetwork struct {
	addr, from string
	key        []byte // the key "the relay" made for the connection
	accepted   chan net.Conn
}

func (f *fakeNetwork) DialNode(ctx context.Context, node string, port uint16) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", f.addr)
	if err != nil {
		return nil, err
	}
	return &vouchedConn{Conn: c, peer: node, key: f.key}, nil
}

// vouchedListener hands out what a TCP listener accepts as connections
// vouched to come from the node from, with key.
type vouchedListener struct {
	net.Listener
	from string
	key  []byte
}

func (l *vouchedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &vouchedConn{Conn: c, peer: l.from, key: l.key}, nil
}

// nodeBehind starts a node's listener with policy p behind a fake
// network that says every connection comes from "from".
func nodeBehind(t *testing.T, p vlink.Policy, from string, key []byte) (*fakeNetwork, <-chan *vlink.Hello) {
	t.Helper()
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.Targets = []selector.Rule{{Host: "localhost"}}
	l, err := (&vlink.ListenConfig{Policy: p}).NewListener(&vouchedListener{Listener: tl, from: from, key: key})
	if err != nil {
		t.Fatal(err)
	}
	return &fakeNetwork{addr: tl.Addr().String(), key: key}, serveHellos(t, l)
}

// Through a relay, members need nothing from it but bytes: what a relay
// could do with the key it hands out (read along, or answer as the node
// dialed, as the key mode allows) fails against members, and an insider
// with a certificate of its own cannot pass for another node.
func TestMemberThroughNetwork(t *testing.T) {
	n := testmember.New(t)
	alice, bob, mallory := n.Member("alice", nodecert.KindNode), n.Member("bob", nodecert.KindNode), n.Member("mallory", nodecert.KindNode)
	relay := n.Member("relay", nodecert.KindRelay)
	relayKey := []byte("the key the relay made, 32 bytes")
	dial := func(net vlink.NodeDialer, m *vlink.Member) (net.Conn, error) {
		d := &vlink.Dialer{Network: net, Member: m, Key: nil}
		defer d.Close()
		return d.Dial("tcp", "bob"+vlink.NodeSuffix+":7000")
	}
	// dialClosed is dial for a connection that should fail: one that
	// does not is closed, so that the test fails rather than waits.
	dialClosed := func(net vlink.NodeDialer, m *vlink.Member) error {
		c, err := dial(net, m)
		if err == nil {
			c.Close()
		}
		return err
	}

	t.Run("bob, told alice dialed", func(t *testing.T) {
		nw, hellos := nodeBehind(t, vlink.Policy{Member: bob}, "alice", relayKey)
		c, err := dial(nw, alice)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		testnet.RoundTrip(t, c, 64<<10)
		if h := nextHello(t, hellos); h.Node != "alice" || h.Cert.Name() != "alice" {
			t.Fatalf("bob accepted %q, want alice", h.Node)
		}
	})
	// Today's key mode: whoever holds the relay's key answers as bob.
	t.Run("key mode: the relay answers as bob", func(t *testing.T) {
		nw, _ := nodeBehind(t, vlink.Policy{Key: key}, "alice", relayKey)
		d := &vlink.Dialer{Network: nw}
		c, err := d.Dial("tcp", "bob"+vlink.NodeSuffix+":7000")
		if err != nil {
			t.Fatalf("the relay's own listener did not pass for bob in key mode: %v", err)
		}
		c.Close()
	})
	for _, tt := range []struct {
		name    string
		as      *vlink.Member // who answers in bob's place
		mention string
	}{
		{"the relay answers as bob", relay, `certificate names "relay"`},
		{"an insider answers as bob", mallory, `certificate names "mallory"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			nw, hellos := nodeBehind(t, vlink.Policy{Member: tt.as}, "alice", relayKey)
			err := dialClosed(nw, alice)
			if !errors.Is(err, vlink.ErrAuth) || !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("err = %v, want ErrAuth mentioning %q", err, tt.mention)
			}
			select {
			case h := <-hellos:
				t.Fatalf("the impostor took a connection from %q", h.Node)
			case <-time.After(50 * time.Millisecond):
			}
		})
	}
	for _, tt := range []struct {
		name    string
		from    string        // who the relay says dialed
		dialer  *vlink.Member // who dials
		code    vlink.RefuseCode
		mention string
	}{
		{"the relay lies about who dialed", "carol", alice, vlink.CodeAuthFailed, `network says node "carol" dialed`},
		{"an insider dials as alice", "alice", mallory, vlink.CodeAuthFailed, `certificate names "mallory"`},
		{"a key-mode node", "alice", nil, vlink.CodeAuthRequired, "with their certificates only"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			nw, hellos := nodeBehind(t, vlink.Policy{Member: bob}, tt.from, relayKey)
			err := dialClosed(nw, tt.dialer)
			var re *vlink.RefusedError
			if !errors.As(err, &re) || re.Code != tt.code || !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("err = %v, want refusal %v mentioning %q", err, tt.code, tt.mention)
			}
			select {
			case h := <-hellos:
				t.Fatalf("bob took a connection from %q", h.Node)
			case <-time.After(50 * time.Millisecond):
			}
		})
	}
}

// The network's rules are enforced by the member that accepts: a member
// they do not let through is refused with ErrNotAllowed, on the hello
// that names the target (the nested one above mux as well).
func TestMemberRules(t *testing.T) {
	n := testmember.New(t)
	gw := n.Member("gw", nodecert.KindNode)
	rules, err := nodecert.NewRules([]nodecert.Rule{{From: "group:ops", To: "gw", Ports: "7000"}})
	if err != nil {
		t.Fatal(err)
	}
	gw.Rules = rules
	alice, bob := n.Member("alice", nodecert.KindNode, "ops"), n.Member("bob", nodecert.KindNode)
	l, hellos := memberListen(t, vlink.Policy{Member: gw, Targets: []selector.Rule{{Host: "localhost"}}})
	for _, tt := range []struct {
		name, stack string
		m           *vlink.Member
		target      string
		ok          bool
	}{
		{"in the group", "noise", alice, "localhost:7000", true},
		{"in the group, through mux", "mux+noise", alice, "localhost:7000", true},
		{"not in the group", "noise", bob, "localhost:7000", false},
		{"not in the group, through mux", "mux+noise", bob, "localhost:7000", false},
		{"another port", "noise", alice, "localhost:7001", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := &vlink.Dialer{Stack: vlink.MustParse(tt.stack), Via: l.Addr().String(), Member: tt.m, WaitAccept: true}
			defer d.Close()
			c, err := d.Dial("tcp", tt.target)
			if tt.ok {
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				testnet.RoundTrip(t, c, 1000)
				if h := nextHello(t, hellos); h.Node != tt.m.Cert.Name() {
					t.Fatalf("accepted %q", h.Node)
				}
				return
			}
			if err == nil {
				c.Close()
				t.Fatal("dial succeeded")
			}
			if !errors.Is(err, vlink.ErrNotAllowed) || !strings.Contains(err.Error(), "rules do not let "+tt.m.Cert.Name()) {
				t.Fatalf("err = %v, want ErrNotAllowed naming the rules", err)
			}
		})
	}
}

// A member's dialer asks no listener to look a name up: the answer
// would be proven by a pre-shared key it does not hold.
func TestMemberNoLookup(t *testing.T) {
	n := testmember.New(t)
	d := &vlink.Dialer{Stack: vlink.MustParse("noise"), Via: "127.0.0.1:1", Member: n.Member("alice", nodecert.KindNode)}
	if _, err := d.LookupHost(t.Context(), "db.internal:5432"); !errors.Is(err, vlink.ErrNoLookup) {
		t.Fatalf("LookupHost = %v, want ErrNoLookup", err)
	}
}
