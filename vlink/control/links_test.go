package control

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testmember"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/vlink"
	"github.com/vlink-dev/vlink/vlink/nodecert"
)

// linkedRelays starts two relays of n's network: relay-2 lists relay-1,
// through a tap that records what crosses between them; and waits until
// they are linked.
func linkedRelays(t *testing.T, n *testmember.Network) (r1, r2 *testRelay, tp *tap) {
	t.Helper()
	r1 = startRelay(t, RelayConfig{Member: n.Member("relay-1", nodecert.KindRelay)}, "")
	tp = startTap(t, r1.addr, 0)
	r2 = startRelay(t, RelayConfig{Member: n.Member("relay-2", nodecert.KindRelay), Peers: []string{tp.ln.Addr().String()}}, "")
	waitUntil(t, "the relays link", func() bool { return len(r1.Peers()) == 1 && len(r2.Peers()) == 1 })
	return r1, r2, tp
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

// online waits until from's relay knows to.
func online(t *testing.T, from *Node, to string) {
	t.Helper()
	waitUntil(t, from.Name()+" sees "+to, func() bool {
		p, err := from.Lookup(ctxT(t), to)
		return err == nil && p.Online
	})
}

// Two relays form one network: a node registered with one reaches a
// node registered with the other by message, by forward and by
// connection on every path, and what crosses between the relays is
// ciphertext.
func TestRelaysLinked(t *testing.T) {
	n := testmember.New(t)
	r1, r2, tp := linkedRelays(t, n)
	aliceM, bobM, carolM := n.Member("alice", nodecert.KindNode), n.Member("bob", nodecert.KindNode), n.Member("carol", nodecert.KindNode)
	alice, bob, carol := memberNode(t, r1.addr, aliceM), memberNode(t, r2.addr, bobM), memberNode(t, r1.addr, carolM)
	echo(bob)
	online(t, alice, "bob")
	online(t, bob, "alice")

	t.Run("message and reply", func(t *testing.T) {
		c := alice.Cooperate(Expect{From: "bob", Type: typeReply})
		if err := c.Send(ctxT(t), "bob", typeEcho, []byte("across relays")); err != nil {
			t.Fatal(err)
		}
		got, err := c.Wait(ctxT(t))
		sum := sha256.Sum256([]byte("across relays"))
		if err != nil || len(got) != 1 || !bytes.Equal(got[0].Payload, append([]byte("bob:"), sum[:]...)) {
			t.Fatalf("reply %v (%v), want bob's checksum", got, err)
		}
	})
	t.Run("forward back across", func(t *testing.T) {
		// bob, at relay-2, delegates alice's request to carol, at relay-1,
		// who answers alice directly.
		bob.Handle(typeNote, func(m *Message) { m.Forward(context.Background(), "carol") })
		carol.Handle(typeNote, func(m *Message) { m.Reply(context.Background(), typeReply, []byte("carol")) })
		c := alice.Cooperate(Expect{From: "carol", Type: typeReply})
		if err := c.Send(ctxT(t), "bob", typeNote, []byte("for carol")); err != nil {
			t.Fatal(err)
		}
		got, err := c.Wait(ctxT(t))
		if err != nil || len(got) != 1 || got[0].From != "carol" {
			t.Fatalf("reply %v (%v), want carol's, forwarded by bob", got, err)
		}
	})
	t.Run("no such node", func(t *testing.T) {
		c := alice.Cooperate(Expect{From: "nobody", Type: typeReply})
		c.Send(ctxT(t), "nobody", typeEcho, nil)
		var de *DeliveryError
		if _, err := c.Wait(ctxT(t)); !errors.As(err, &de) || de.Code != CodeNoNode {
			t.Fatalf("Wait = %v, want no such node", err)
		}
	})

	marker := []byte("a payload no relay may see, ")
	payload := bytes.Repeat(marker, (1<<20)/len(marker))
	rand.Read(payload[len(payload)/2:])
	errs := sumServer(t, bob, bobM)
	for _, tt := range []struct {
		name  string
		paths Paths
	}{
		{"relayed through both relays", PathRelay},
		{"spliced", PathSplice},
	} {
		t.Run(tt.name, func(t *testing.T) {
			relayed := r1.Stats().RelayedTotal + r2.Stats().RelayedTotal
			d := &vlink.Dialer{Stack: vlink.MustParse("zstd"), Network: pathsOnly{alice, tt.paths}, Member: aliceM}
			defer d.Close()
			got, err := sumOf(t, d, payload)
			want := sha256.Sum256(payload)
			if err != nil || !bytes.Equal(got, want[:]) {
				t.Fatalf("bob's checksum %x (%v), want %x", got, err, want)
			}
			if berr := <-errs; berr != nil {
				t.Fatalf("bob read: %v", berr)
			}
			carried := r1.Stats().RelayedTotal + r2.Stats().RelayedTotal - relayed
			if want := map[Paths]uint64{PathRelay: 2, PathSplice: 0}[tt.paths]; carried != want {
				t.Fatalf("the relays carried %d halves, want %d", carried, want)
			}
		})
	}
	if tp.contains(marker[:20]) {
		t.Fatal("the wire between the relays carries the payload in clear")
	}
}

// A relay dies: the nodes registered with it move to the other within
// about a second, and a connection between nodes of both works again
// within 2 s; one that went through the dead relay ends in an error.
func TestRelayFailover(t *testing.T) {
	n := testmember.New(t)
	r1, r2, _ := linkedRelays(t, n)
	aliceM, bobM := n.Member("alice", nodecert.KindNode), n.Member("bob", nodecert.KindNode)
	alice := memberNode(t, r1.addr, aliceM)
	bob := connect(t, r2.addr, "", func(c *Config) { c.Key, c.Member, c.Relays = nil, bobM, []string{r2.addr, r1.addr} })
	online(t, alice, "bob")
	errs := sumServer(t, bob, bobM)

	d := &vlink.Dialer{Stack: vlink.MustParse("identity"), Network: pathsOnly{alice, PathRelay}, Member: aliceM}
	defer d.Close()
	c, err := d.DialContext(ctxT(t), "tcp", "bob.vlink.alt:5432")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	chunk := make([]byte, 64<<10)
	if _, err := c.Write(chunk); err != nil {
		t.Fatal(err)
	}

	r2.stop()
	died := time.Now()
	// alice's connection went alice -> relay-1 -> relay-2 -> bob.
	c.SetDeadline(time.Now().Add(10 * time.Second))
	var werr error
	for werr == nil {
		_, werr = c.Write(chunk)
	}
	if errors.Is(werr, os.ErrDeadlineExceeded) {
		t.Fatal("alice's connection through the dead relay still takes bytes")
	}
	if berr := <-errs; berr == nil {
		t.Fatal("bob's end of the connection through the dead relay ended cleanly")
	}

	for {
		c, err := d.DialContext(ctxT(t), "tcp", "bob.vlink.alt:5432")
		if err == nil {
			c.Write([]byte("again"))
			c.(interface{ CloseWrite() error }).CloseWrite()
			got, _ := io.ReadAll(c)
			c.Close()
			if want := sha256.Sum256([]byte("again")); bytes.Equal(got, want[:]) {
				break
			}
		}
		if time.Since(died) > 10*time.Second {
			t.Fatalf("no connection to bob 10 s after his relay died: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	took := time.Since(died)
	t.Logf("a new connection to bob %v after his relay died", took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("a new connection took %v after the relay died, want at most 2 s", took)
	}
}

// A relay trusts no other blindly: a link takes a relay's certificate of
// the same owner, and nothing else, either way.
func TestRelayLinkRefused(t *testing.T) {
	n := testmember.New(t)
	r1 := startRelay(t, RelayConfig{Member: n.Member("relay-1", nodecert.KindRelay)}, "")
	for _, tt := range []struct {
		name  string
		m     *vlink.Member
		login string
	}{
		{"a node's certificate", n.Member("mallory", nodecert.KindNode), LoginMalformed},
		{"another owner's relay", testmember.New(t).Member("relay-2", nodecert.KindRelay), LoginAuthFailed},
		{"this relay's own name", n.Member("relay-1", nodecert.KindRelay), LoginRefused},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := r1.Stats().FailedLogins[tt.login]
			d := &vlink.Dialer{Stack: vlink.MustParse(vlink.EncryptionLayer), Member: tt.m, PeerCert: relayOnly}
			c, err := d.DialContext(ctxT(t), "tcp", r1.addr)
			if err == nil {
				c.Write((&frame{op: opLink, addrs: []netip.AddrPort{netip.MustParseAddrPort("[::]:7")}}).append(nil))
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				var f *frame
				if f, err = readFrame(c); err == nil && f.op == opLink {
					_, err = readFrame(c) // the directory, or the end
				}
				c.Close()
			}
			if err == nil || len(r1.Peers()) != 0 {
				t.Fatalf("relay-1 linked (%v), peers %v", err, r1.Peers())
			}
			waitUntil(t, "the refusal is counted as "+tt.login, func() bool { return r1.Stats().FailedLogins[tt.login] > before })
		})
	}
	t.Run("a node listening where a peer relay should", func(t *testing.T) {
		impostor := &vlink.ListenConfig{Policy: vlink.Policy{Member: n.Member("mallory", nodecert.KindNode), Plain: vlink.PlainRefuse}}
		l, err := impostor.Listen(context.Background(), "tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		testnet.Serve(t, l, func(c net.Conn) { c.Close() })
		var logs syncBuffer
		r := startRelay(t, RelayConfig{Member: n.Member("relay-2", nodecert.KindRelay), Peers: []string{l.Addr().String()},
			Logger: slog.New(slog.NewTextHandler(&logs, nil))}, "")
		waitUntil(t, "relay-2 says why it does not link", func() bool { return strings.Contains(logs.String(), "not a relay of this network") })
		if got := r.Peers(); len(got) != 0 {
			t.Fatalf("relay-2 linked with %v", got)
		}
	})
}

func TestRelayPeersNeedMember(t *testing.T) {
	_, err := NewRelay(RelayConfig{Peers: []string{"127.0.0.1:1"}})
	if err == nil || !strings.Contains(err.Error(), "only in a network with an owner") {
		t.Fatalf("NewRelay = %v, want peers refused without a certificate", err)
	}
}

// Two relays that list each other both dial, and keep one link: the
// one the relay with the smaller name dialed, on both sides, for good.
func TestRelaysListEachOther(t *testing.T) {
	n := testmember.New(t)
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var logs [2]syncBuffer
	r1 := startRelay(t, RelayConfig{Member: n.Member("relay-1", nodecert.KindRelay), Peers: []string{ln2.Addr().String()},
		Logger: slog.New(slog.NewTextHandler(&logs[0], nil))}, "")
	r2, err := NewRelay(RelayConfig{Member: n.Member("relay-2", nodecert.KindRelay), Peers: []string{r1.addr},
		Logger: slog.New(slog.NewTextHandler(&logs[1], nil))})
	if err != nil {
		t.Fatal(err)
	}
	l2, err := r2.NewListener(ln2, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r2.Serve(l2) }()
	defer func() { r2.Close(); <-done }()
	// Each dials the other; both keep the link relay-1 dialed. If
	// relay-2's dial lands first, relay-1's replaces it once, a moment
	// later: settled is when relay-1's own dial is the link.
	waitUntil(t, "the relays link", func() bool {
		return len(r1.Peers()) == 1 && len(r2.Peers()) == 1 &&
			strings.Contains(logs[0].String(), `msg="control: relay: linked with another relay" relay=relay-2 dialed=true`)
	})

	links := func() (n [2]int) {
		for i := range logs {
			n[i] = strings.Count(logs[i].String(), "linked with another relay")
		}
		return n
	}
	settled := links()
	time.Sleep(2 * time.Second) // several of the dialers' retry intervals
	if got := links(); got != settled || len(r1.Peers()) != 1 || len(r2.Peers()) != 1 {
		t.Fatalf("links made %v, then %v 2 s later (peers %v, %v): the relays keep replacing their link", settled, got, r1.Peers(), r2.Peers())
	}
	alice := memberNode(t, r1.addr, n.Member("alice", nodecert.KindNode))
	bob := memberNode(t, l2.Addr().String(), n.Member("bob", nodecert.KindNode))
	echo(bob)
	online(t, alice, "bob")
	c := alice.Cooperate(Expect{From: "bob", Type: typeReply})
	if err := c.Send(ctxT(t), "bob", typeEcho, []byte("one link")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// A relay whose certificate is revoked loses its links at the next
// Recheck, and cannot link again.
func TestRelayLinkRevoked(t *testing.T) {
	n := testmember.New(t)
	list := filepath.Join(t.TempDir(), "revoked")
	if err := os.WriteFile(list, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	trust, err := nodecert.NewTrust(n.Owner.Public(), list)
	if err != nil {
		t.Fatal(err)
	}
	m1 := n.Member("relay-1", nodecert.KindRelay)
	m1.Trust = trust
	r1 := startRelay(t, RelayConfig{Member: m1}, "")
	m2 := n.Member("relay-2", nodecert.KindRelay)
	r2 := startRelay(t, RelayConfig{Member: m2, Peers: []string{r1.addr}}, "")
	waitUntil(t, "the relays link", func() bool { return len(r1.Peers()) == 1 && len(r2.Peers()) == 1 })

	if err := os.WriteFile(list, []byte(m2.Cert.Fingerprint()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := trust.Reload(); err != nil {
		t.Fatal(err)
	}
	r1.Recheck()
	waitUntil(t, "relay-1 drops the link", func() bool { return len(r1.Peers()) == 0 })
	before := r1.Stats().FailedLogins[LoginAuthFailed]
	waitUntil(t, "relay-2's next attempt is refused", func() bool { return r1.Stats().FailedLogins[LoginAuthFailed] > before })
	if got := r1.Peers(); len(got) != 0 {
		t.Fatalf("relay-1 linked with %v after revoking it", got)
	}
}

// However long its relay was away, a node is registered again within
// 10 s of its return: the waits between its attempts, which it logs,
// never exceed 8 s.
func TestReregisterAfterLongOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("a 15 s outage")
	}
	t.Parallel()
	n := testmember.New(t)
	m := n.Member("relay", nodecert.KindRelay)
	r := startRelay(t, RelayConfig{Member: m}, "")
	var logs syncBuffer
	alice := n.Member("alice", nodecert.KindNode)
	connect(t, r.addr, "", func(c *Config) { c.Key, c.Member, c.Logger = nil, alice, slog.New(slog.NewTextHandler(&logs, nil)) })
	r.stop()
	time.Sleep(15 * time.Second) // long enough for the waits to reach their cap
	back := time.Now()
	r = startRelay(t, RelayConfig{Member: m}, r.addr)
	waitUntil(t, "alice registers again", func() bool { return len(r.Nodes()) == 1 })
	took := time.Since(back)
	t.Logf("alice registered again %v after the relay came back", took.Round(time.Millisecond))
	if took > 10*time.Second {
		t.Errorf("alice registered again %v after the relay came back, want at most 10 s", took)
	}
	var waits []time.Duration
	for _, m := range regexp.MustCompile(`"retry in"=(\S+)`).FindAllStringSubmatch(logs.String(), -1) {
		d, err := time.ParseDuration(m[1])
		if err != nil {
			t.Fatal(err)
		}
		waits = append(waits, d)
	}
	if len(waits) < 4 || slices.Max(waits) > 8*time.Second {
		t.Fatalf("alice waited %v between attempts, want at least 4 waits, none over 8 s", waits)
	}
}

// What a linked relay sends is bounded and checked like what a node
// sends: a link that breaks the rules ends, and the relay goes on.
func TestRelayLinkAbuse(t *testing.T) {
	n := testmember.New(t)
	r1 := startRelay(t, RelayConfig{Member: n.Member("relay-1", nodecert.KindRelay), MaxNodes: 3}, "")
	alice := memberNode(t, r1.addr, n.Member("alice", nodecert.KindNode))
	rogue := n.Member("relay-2", nodecert.KindRelay)
	joinedN := func(k int) []*frame {
		var fs []*frame
		for i := range k {
			fs = append(fs, &frame{op: opJoined, name: "n" + strconv.Itoa(i), addrs: []netip.AddrPort{netip.MustParseAddrPort("192.0.2.1:1")}})
		}
		return fs
	}
	for _, tt := range []struct {
		name   string
		frames []*frame
	}{
		{"more nodes than the relay takes", joinedN(4)},
		{"a node's frame passed on", []*frame{{op: opVia, name: "alice", payload: (&frame{op: opSend, typ: 1, name: "alice"}).append(nil)}}},
		{"a frame cut short passed on", []*frame{{op: opVia, name: "alice", payload: (&frame{op: opDeliver, typ: 1, name: "x", payload: []byte("hi")}).append(nil)[:12]}}},
		{"a registration on a link", []*frame{{op: opAdvertise}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := &vlink.Dialer{Stack: vlink.MustParse(vlink.EncryptionLayer), Member: rogue, PeerCert: relayOnly}
			c, err := d.DialContext(ctxT(t), "tcp", r1.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			b := (&frame{op: opLink, addrs: []netip.AddrPort{netip.MustParseAddrPort("[::]:7")}}).append(nil)
			for _, f := range tt.frames {
				b = f.append(b)
			}
			if _, err := c.Write(b); err != nil {
				t.Fatal(err)
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			for err == nil {
				var f *frame
				if f, err = readFrame(c); err == nil && f.op == opVia {
					t.Fatalf("relay-1 passed on %v", f)
				}
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal("relay-1 kept the link")
			}
			waitUntil(t, "relay-1 forgets the link", func() bool { return len(r1.Peers()) == 0 && r1.Stats().RemoteNodes == 0 })
			p, err := alice.Lookup(ctxT(t), "alice")
			if err != nil || !p.Online {
				t.Fatalf("relay-1 lost alice: %v, %v", p, err)
			}
		})
	}
}

// A certificate that expires while its node is registered is dropped
// within the relay's recheck interval, and cannot register again.
func TestRelayDropsExpired(t *testing.T) {
	old := recheckInterval
	recheckInterval = 100 * time.Millisecond
	defer func() { recheckInterval = old }()
	n := testmember.New(t)
	r := startMemberRelay(t, n)
	priv := vlink.NewIdentity()
	pub, err := vlink.IdentityPublic(priv)
	if err != nil {
		t.Fatal(err)
	}
	expires := time.Now().Add(2 * time.Second).Truncate(time.Second).Add(time.Second)
	cert, err := nodecert.Sign(n.Owner, nodecert.Template{Name: "brief", Kind: nodecert.KindNode, PublicKey: pub, NotAfter: expires})
	if err != nil {
		t.Fatal(err)
	}
	memberNode(t, r.addr, &vlink.Member{Cert: cert, Private: priv, Trust: n.Trust})
	if got := len(r.Nodes()); got != 1 {
		t.Fatalf("%d nodes registered, want brief", got)
	}
	waitUntil(t, "the relay drops brief", func() bool { return len(r.Nodes()) == 0 })
	if late := time.Since(expires); late < 0 || late > time.Second {
		t.Fatalf("brief was dropped %v after its certificate expired, want within the recheck interval", late)
	}
}
