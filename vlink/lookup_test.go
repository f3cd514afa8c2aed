package vlink_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

// lookupListener answers lookups from a table of names: v4.test has IPv4
// addresses only, both.test both families, any other name none.
func lookupListener(t *testing.T, key []byte) *vlink.Listener {
	t.Helper()
	return listen(t, vlink.ListenConfig{
		Policy: vlink.Policy{Key: key, Targets: []selector.Rule{{Host: "*.test", Action: selector.Direct}}},
		Lookup: func(ctx context.Context, h *vlink.Hello) (vlink.Families, error) {
			host, _, _ := net.SplitHostPort(h.Target)
			switch host {
			case "v4.test":
				return vlink.FamilyIPv4, nil
			case "both.test":
				return vlink.FamilyIPv4 | vlink.FamilyIPv6, nil
			}
			return 0, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		},
	})
}

func TestLookupHost(t *testing.T) {
	ctx := context.Background()
	for _, k := range []struct {
		name string
		key  []byte
	}{{"no key", nil}, {"key", key}} {
		t.Run(k.name, func(t *testing.T) {
			l := lookupListener(t, k.key)
			d := &vlink.Dialer{Stack: vlink.MustParse("test-xor"), Via: l.Addr().String(), Key: k.key}
			for _, tc := range []struct {
				address string
				want    vlink.Families
			}{
				{"v4.test:80", vlink.FamilyIPv4},
				{"both.test:0", vlink.FamilyIPv4 | vlink.FamilyIPv6},
				{"192.0.2.1:80", vlink.FamilyIPv4}, // an address is its own answer
				{"[2001:db8::1]:80", vlink.FamilyIPv6},
			} {
				if got, err := d.LookupHost(ctx, tc.address); err != nil || got != tc.want {
					t.Errorf("LookupHost(%s) = %v, %v; want %v", tc.address, got, err, tc.want)
				}
			}
			_, err := d.LookupHost(ctx, "nosuch.test:80")
			var dnsErr *net.DNSError
			if !errors.As(err, &dnsErr) || !dnsErr.IsNotFound || dnsErr.Name != "nosuch.test" {
				t.Errorf("LookupHost of a name the far side does not know: %v, want a *net.DNSError, not found", err)
			}
			if _, err := d.LookupHost(ctx, "elsewhere.example:80"); !errors.Is(err, vlink.ErrNotAllowed) {
				t.Errorf("LookupHost of a target the policy refuses: %v, want ErrNotAllowed", err)
			}
			// The lookups connected nothing: the listener's Accept got none.
			c, err := d.Dial("tcp", "v4.test:80")
			if err != nil {
				t.Fatal(err)
			}
			testnet.RoundTrip(t, c, 1000)
			c.Close()
		})
	}
	t.Run("listener without Lookup", func(t *testing.T) {
		l := listen(t, vlink.ListenConfig{Policy: vlink.Policy{Targets: []selector.Rule{{Action: selector.Direct}}}})
		d := &vlink.Dialer{Stack: vlink.MustParse("test-xor"), Via: l.Addr().String()}
		var re *vlink.RefusedError
		if _, err := d.LookupHost(ctx, "v4.test:80"); !errors.As(err, &re) || re.Code != vlink.CodeRejected {
			t.Errorf("LookupHost through a listener that does not look up: %v, want CodeRejected", err)
		}
	})
	t.Run("no gateway", func(t *testing.T) {
		// Resolved here, as the dial would be.
		d := &vlink.Dialer{Stack: vlink.MustParse("test-xor")}
		if got, err := d.LookupHost(ctx, "localhost:80"); err != nil || got&vlink.FamilyIPv4 == 0 {
			t.Errorf("LookupHost(localhost) = %v, %v; want IPv4 at least", got, err)
		}
	})
}

// TestLookupAnswerAuthenticated: a box on the path that changes a keyed
// lookup's answer (IPv4 into IPv6) makes the lookup fail: the answer is
// bound to the key.
func TestLookupAnswerAuthenticated(t *testing.T) {
	l := lookupListener(t, key)
	front, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testnet.Serve(t, front, func(c net.Conn) {
		up, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			return
		}
		defer up.Close()
		go io.Copy(up, c)
		// Frames from the listener: the challenge, then the accept,
		// whose last byte is the family field's value.
		for {
			var h [4]byte
			if _, err := io.ReadFull(up, h[:]); err != nil {
				return
			}
			body := make([]byte, binary.BigEndian.Uint16(h[2:]))
			if _, err := io.ReadFull(up, body); err != nil {
				return
			}
			if h[1] == 4 && len(body) > 0 { // the accept
				body[len(body)-1] = byte(vlink.FamilyIPv6)
			}
			c.Write(append(h[:], body...))
		}
	})
	d := &vlink.Dialer{Stack: vlink.MustParse("test-xor"), Via: front.Addr().String(), Key: key}
	if f, err := d.LookupHost(context.Background(), "v4.test:80"); !errors.Is(err, vlink.ErrAuth) {
		t.Errorf("LookupHost through a box that changed the answer: %v, %v; want ErrAuth", f, err)
	}
}
