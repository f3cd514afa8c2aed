package vlink

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/vlink/nodecert"
)

// A hello with a certificate that also names route fields (hops, an
// origin, a trail) is refused: a member would otherwise vouch for an
// origin it never saw, with a certificate anyone can copy.
func TestMemberHelloWithRouteFields(t *testing.T) {
	owner, err := nodecert.NewOwner()
	if err != nil {
		t.Fatal(err)
	}
	trust, err := nodecert.NewTrust(owner.Public(), "")
	if err != nil {
		t.Fatal(err)
	}
	member := func(name string) *Member {
		priv := NewIdentity()
		pub, _ := IdentityPublic(priv)
		cert, err := nodecert.Sign(owner, nodecert.Template{Name: name, Kind: nodecert.KindNode, PublicKey: pub})
		if err != nil {
			t.Fatal(err)
		}
		return &Member{Cert: cert, Private: priv, Trust: trust}
	}
	l, err := (&ListenConfig{Policy: Policy{Member: member("gw")}}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	alice := member("alice").Cert.Marshal()
	for name, m := range map[string]*message{
		"origin": {cert: alice, origin: "192.0.2.1:4000", trail: make([]byte, trailIDSize)},
		"hops":   {cert: alice, hops: []string{"192.0.2.2:7000"}},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Write(helloBytes(m, nil)); err != nil {
				t.Fatal(err)
			}
			ans, _, err := readFrame(c, msgAccept, msgRefuse)
			if err != nil {
				t.Fatal(err)
			}
			if ans.typ != msgRefuse || ans.code != CodeLayer || !strings.Contains(ans.reason, "route layers") {
				t.Fatalf("answer %s code %v (%s), want a refusal of the route fields", ans.typ, ans.code, ans.reason)
			}
			io.Copy(io.Discard, c)
		})
	}
}
