package netconn_test

import (
	"errors"
	"net"
	"syscall"
	"testing"

	"github.com/vlink-dev/vlink/netconn"
)

// flaky is a listener whose first Accept fails as a full descriptor
// table does.
type flaky struct {
	net.Listener
	failed bool
}

func (f *flaky) Accept() (net.Conn, error) {
	if !f.failed {
		f.failed = true
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
	}
	return f.Listener.Accept()
}

func TestMerge(t *testing.T) {
	a, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := netconn.Merge(&flaky{Listener: a}, b)
	if m.Addr().String() != a.Addr().String() {
		t.Errorf("Addr %v, want the first's, %v", m.Addr(), a.Addr())
	}
	// The temporary failure comes out, and a is accepted from after it.
	if _, err := m.Accept(); !errors.Is(err, syscall.EMFILE) {
		t.Fatalf("first Accept: %v, want EMFILE", err)
	}
	for _, l := range []net.Listener{a, b} {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := m.Accept()
		if err != nil {
			t.Fatalf("Accept of a connection to %v: %v", l.Addr(), err)
		}
		if s.LocalAddr().String() != l.Addr().String() {
			t.Errorf("accepted on %v, want %v", s.LocalAddr(), l.Addr())
		}
		s.Close()
	}
	m.Close()
	if _, err := m.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
	if _, err := net.Dial("tcp", b.Addr().String()); err == nil {
		t.Error("b still listens after Close")
	}
}
