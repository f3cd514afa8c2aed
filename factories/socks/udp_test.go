package socks_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/factories/socks"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// startUDPServer serves srv, running the associations it grants.
func startUDPServer(t *testing.T, srv *socks.Server) string {
	t.Helper()
	return testnet.Listen(t, func(c net.Conn) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, req, err := srv.Handshake(ctx, c)
		cancel()
		if err != nil || req.Association == nil {
			return
		}
		req.Association.Serve(context.Background(), c)
	})
}

// associate asks addr for a UDP association, as a SOCKS5 client does,
// and returns the control connection and the relay's address.
func associate(t *testing.T, addr string) (net.Conn, netip.AddrPort, byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte{5, 1, 0})
	var sel [2]byte
	if _, err := c.Read(sel[:]); err != nil || sel != [2]byte{5, 0} {
		t.Fatalf("method selection: %v %v", sel, err)
	}
	c.Write([]byte{5, 3, 0, 1, 0, 0, 0, 0, 0, 0}) // UDP ASSOCIATE, address unknown yet
	var rep [10]byte
	if _, err := c.Read(rep[:]); err != nil {
		t.Fatal(err)
	}
	if rep[1] != 0 {
		return c, netip.AddrPort{}, rep[1]
	}
	relay := netip.AddrPortFrom(netip.AddrFrom4([4]byte(rep[4:8])), binary.BigEndian.Uint16(rep[8:10]))
	c.SetDeadline(time.Time{})
	return c, relay, 0
}

// header is a SOCKS5 UDP request header for to.
func header(frag byte, to netip.AddrPort) []byte {
	h := []byte{0, 0, frag, 1}
	h = append(h, to.Addr().AsSlice()...)
	return binary.BigEndian.AppendUint16(h, to.Port())
}

func TestUDPAssociate(t *testing.T) {
	echo := testnet.UDPEcho(t)
	var log testnet.Buffer
	srv := &socks.Server{Dialer: &recordingDialer{}, UDP: &socks.UDPConfig{Logger: slog.New(slog.NewTextHandler(&log, nil))}}
	addr := startUDPServer(t, srv)
	ctl, relay, code := associate(t, addr)
	if code != 0 {
		t.Fatalf("UDP ASSOCIATE answered %d, want 0 (granted)", code)
	}
	u, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(relay))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	buf := make([]byte, 65535)
	wait := 5 * time.Second
	exchange := func(msg []byte) ([]byte, error) {
		u.Write(msg)
		u.SetReadDeadline(time.Now().Add(wait))
		n, err := u.Read(buf)
		return buf[:n], err
	}
	// The relay's first datagram fixes the client's port, as the request
	// named none: datagrams from elsewhere are dropped from then on.
	payload := []byte("hello through the association")
	got, err := exchange(append(header(0, echo), payload...))
	if want := append(header(0, echo), payload...); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("answer %q, %v; want the echo with its header naming the destination, %q", got, err, want)
	}
	// Bad input: each dropped, the association goes on. A drop shows as
	// no answer: a short wait says enough.
	wait = 200 * time.Millisecond
	other, _ := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(relay))
	defer other.Close()
	other.Write(append(header(0, echo), "from another port"...))
	for _, bad := range []struct {
		name string
		msg  []byte
	}{
		{"fragment", append(header(1, echo), "part one"...)},
		{"reserved bits", append([]byte{0, 1}, append(header(0, echo), "x"...)[2:]...)},
		{"truncated", header(0, echo)[:6]},
		{"unknown address type", []byte{0, 0, 0, 9, 1, 2, 3, 4, 0, 53, 'x'}},
	} {
		if got, err := exchange(bad.msg); err == nil {
			t.Errorf("%s: answered %q, want it dropped", bad.name, got)
		}
	}
	wait = 5 * time.Second
	if got, err := exchange(append(header(0, echo), "still here"...)); err != nil || !strings.HasSuffix(string(got), "still here") {
		t.Fatalf("after the bad datagrams: %q, %v", got, err)
	}
	// The association ends with the control connection.
	ctl.Close()
	for end := time.Now().Add(5 * time.Second); ; {
		if !strings.Contains(log.String(), "ended with datagrams dropped") {
			if time.Now().After(end) {
				t.Fatalf("no summary of the drops when the association ended; log:\n%s", log.String())
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		break
	}
	for _, want := range []string{"from_others=1", "fragments=1", "malformed=3"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the summary does not say %s:\n%s", want, log.String())
		}
	}
	wait = time.Second
	_, err = exchange(append(header(0, echo), "after the end"...))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("a datagram after the association ended: %v, want ECONNREFUSED (its port is closed)", err)
	}
}

func TestUDPAssociateNotServed(t *testing.T) {
	addr := startUDPServer(t, &socks.Server{Dialer: &recordingDialer{}})
	if _, _, code := associate(t, addr); code != 7 {
		t.Fatalf("UDP ASSOCIATE without Server.UDP answered %d, want 7 (command not supported)", code)
	}
}

// A destination that cannot be reached starts no session, says why, and
// the others still work.
func TestUDPAssociateUnreachable(t *testing.T) {
	echo := testnet.UDPEcho(t)
	var log testnet.Buffer
	d := &recordingDialer{}
	srv := &socks.Server{Dialer: d, UDP: &socks.UDPConfig{Logger: slog.New(slog.NewTextHandler(&log, nil))}}
	_, relay, _ := associate(t, startUDPServer(t, srv))
	u, _ := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(relay))
	defer u.Close()
	name := []byte{0, 0, 0, 3, byte(len("no-such-host.invalid"))}
	name = append(name, "no-such-host.invalid"...)
	name = binary.BigEndian.AppendUint16(name, 53)
	u.Write(append(name, "query"...))
	for end := time.Now().Add(10 * time.Second); !strings.Contains(log.String(), "cannot reach destination"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no word of the unreachable destination; log:\n%s", log.String())
		}
	}
	u.Write(append(header(0, echo), "ok"...))
	u.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	if n, err := u.Read(buf); err != nil || !strings.HasSuffix(string(buf[:n]), "ok") {
		t.Fatalf("the reachable destination: %q, %v", buf[:n], err)
	}
}
