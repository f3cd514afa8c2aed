package socks

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"
)

// script is a proxy that answers with fixed bytes and swallows writes.
type script struct{ r *bytes.Reader }

func (s script) Read(p []byte) (int, error)  { return s.r.Read(p) }
func (s script) Write(p []byte) (int, error) { return len(p), nil }

// FuzzReply4 feeds arbitrary proxy answers to the SOCKS4 client: it must
// never panic, read no more than one reply, and succeed only on a granted
// reply.
func FuzzReply4(f *testing.F) {
	f.Add([]byte{0, 90, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{4, 90, 1, 2, 3, 4, 5, 6, 'x'})
	f.Add([]byte{0, 91, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0, 93})
	f.Add([]byte("HTTP/1.1 400 Bad Request\r\n"))
	f.Fuzz(func(t *testing.T, answer []byte) {
		r := bytes.NewReader(answer)
		err := handshake4(script{r}, dest{name: "example.org", port: 80}, "u")
		if read := len(answer) - r.Len(); read > reply4Size {
			t.Fatalf("read %d bytes, a reply is %d", read, reply4Size)
		}
		granted := len(answer) >= reply4Size && (answer[0] == 0 || answer[0] == 4) && answer[1] == rep4Granted
		if (err == nil) != granted {
			t.Fatalf("answer % x: err = %v, granted = %v", answer, err, granted)
		}
		if err != nil {
			var re *ReplyError
			if !errors.Is(err, ErrProtocol) && !errors.As(err, &re) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("answer % x: unclassified error %v", answer, err)
			}
		}
	})
}

// FuzzHandshake5 feeds arbitrary proxy answers to the SOCKS5 client
// (with and without credentials): it must never panic, read a bounded
// number of bytes, and succeed only when the proxy granted the CONNECT.
func FuzzHandshake5(f *testing.F) {
	f.Add([]byte{5, 0, 5, 0, 0, 1, 0, 0, 0, 0, 0, 0}, false)
	f.Add([]byte{5, 2, 1, 0, 5, 0, 0, 3, 4, 'a', 'b', 'c', 'd', 0, 80}, true)
	f.Add([]byte{5, 0, 5, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 80}, false)
	f.Add([]byte{5, 0xff}, true)
	f.Add([]byte{5, 2, 1, 1}, true)
	f.Add([]byte{5, 0, 5, 1, 0, 1}, false)
	f.Add([]byte{5, 0, 5, 0, 0, 3, 0}, false)
	f.Fuzz(func(t *testing.T, answer []byte, auth bool) {
		user, pw := "", ""
		if auth {
			user, pw = "alice", "secret"
		}
		r := bytes.NewReader(answer)
		d := dest{ip: netip.MustParseAddr("10.0.0.1"), port: 80}
		err := handshake5(script{r}, d, user, pw)
		// greeting 2 + auth 2 + reply header 4 + name 1+255 + port 2
		if read := len(answer) - r.Len(); read > 2+2+4+256+2 {
			t.Fatalf("read %d bytes", read)
		}
		if err == nil && (len(answer) < 10 || answer[0] != 5) {
			t.Fatalf("answer % x accepted", answer)
		}
	})
}

// FuzzServerHandshake feeds arbitrary client bytes to the server: it must
// never panic, read a bounded number of bytes, and dial only for a
// well-formed CONNECT.
func FuzzServerHandshake(f *testing.F) {
	f.Add([]byte{5, 1, 0, 5, 1, 0, 3, 4, 'h', 'o', 's', 't', 0, 80}, false)
	f.Add([]byte{5, 1, 2, 1, 5, 'a', 'l', 'i', 'c', 'e', 2, 'p', 'w', 5, 1, 0, 1, 10, 0, 0, 1, 0, 80}, true)
	f.Add([]byte{4, 1, 0, 80, 0, 0, 0, 1, 'u', 0, 'h', 'o', 's', 't', 0}, false)
	f.Add([]byte{4, 1, 0, 80, 10, 0, 0, 1, 0}, false)
	f.Add([]byte{5, 1, 0, 5, 3, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 53}, false)
	f.Add([]byte("GET / HTTP/1.1\r\n"), false)
	f.Fuzz(func(t *testing.T, in []byte, auth bool) {
		srv := &Server{Dialer: refuseAll{}}
		if auth {
			srv.User, srv.Password = "alice", "pw"
		}
		c := &fakeConn{r: bytes.NewReader(in)}
		out, _, err := srv.Handshake(context.Background(), c)
		if err == nil || out != nil {
			t.Fatalf("handshake succeeded with a dialer that refuses everything")
		}
		// version 1 + greeting 1+255 + credentials 2+255+1+255 + request 4+1+255+2, or SOCKS4 8+256+256
		if read := len(in) - c.r.Len(); read > 1+256+513+262 {
			t.Fatalf("read %d bytes", read)
		}
	})
}

type refuseAll struct{}

func (refuseAll) DialContext(context.Context, string, string) (net.Conn, error) {
	return nil, syscall.ECONNREFUSED
}

// fakeConn reads from a fixed input and swallows writes.
type fakeConn struct {
	net.Conn
	r *bytes.Reader
}

func (c *fakeConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *fakeConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *fakeConn) SetDeadline(time.Time) error      { return nil }
func (c *fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (c *fakeConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzAssociationDatagram feeds an association's reader whatever a client
// could send: nothing panics, and at most MaxDests sessions start.
func FuzzAssociationDatagram(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 127, 0, 0, 1, 0, 53, 'q'})
	f.Add([]byte{0, 0, 0, 3, 4, 'h', 'o', 's', 't', 0, 53, 'q'})
	f.Add([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 53, 'q'})
	f.Add([]byte{0, 0, 1, 1, 127, 0, 0, 1, 0, 53, 'q'})
	f.Add([]byte{0, 0, 0, 3, 0, 0, 53})
	f.Fuzz(func(t *testing.T, b []byte) {
		a := fuzzAssociation(2)
		client := netip.AddrPortFrom(a.client, 4000)
		for i := 0; i < 3 && len(b) > 0; i++ { // the same bytes, and a few shorter
			a.receive(client, b)
			b = b[:len(b)/2]
		}
		a.mu.Lock()
		n := len(a.dests)
		a.mu.Unlock()
		if n > 2 {
			t.Fatalf("%d sessions started, MaxDests is 2", n)
		}
		a.cancel()
		a.wg.Wait()
	})
}

// fuzzAssociation is an association whose dials fail at once and whose
// sessions end as soon as they start, for feeding its reader.
func fuzzAssociation(maxDests int) *Association {
	a := &Association{client: netip.MustParseAddr("127.0.0.1"), cfg: UDPConfig{MaxDests: maxDests, Idle: time.Second},
		dests: map[string]*assocDest{},
		dial: func(context.Context, string, string) (net.Conn, error) {
			return nil, errors.New("no dialing while fuzzing")
		}}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.cancel() // a failed session waits for nothing
	return a
}
