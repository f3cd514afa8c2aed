package dgram

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// pair returns two Conns over one TCP connection: on a pipe a frame's
// write would wait for its read.
func pair(t *testing.T) (*Conn, *Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return NewConn(a, nil, nil), NewConn(b, nil, nil)
}

func TestBoundaries(t *testing.T) {
	a, b := pair(t)
	sizes := []int{0, 1, 1472, 9000, MaxDatagram}
	go func() {
		for _, n := range sizes {
			if _, err := a.Write(bytes.Repeat([]byte{byte(n)}, n)); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	buf := make([]byte, MaxDatagram+10)
	for _, n := range sizes {
		got, err := b.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		if got != n || !bytes.Equal(buf[:got], bytes.Repeat([]byte{byte(n)}, n)) {
			t.Fatalf("read %d bytes, want the datagram of %d whole", got, n)
		}
	}
}

func TestTooBig(t *testing.T) {
	a, _ := pair(t)
	_, err := a.Write(make([]byte, MaxDatagram+1))
	if !errors.Is(err, syscall.EMSGSIZE) {
		t.Fatalf("write of %d bytes: %v, want EMSGSIZE", MaxDatagram+1, err)
	}
	if _, err := a.Write([]byte("next")); err != nil {
		t.Fatalf("the next write: %v", err)
	}
}

// A short buffer gets the datagram's start, and the next Read the next
// datagram, as from a UDP socket.
func TestTruncates(t *testing.T) {
	a, b := pair(t)
	a.Write([]byte("0123456789"))
	a.Write([]byte("next"))
	buf := make([]byte, 4)
	n, err := b.Read(buf)
	if err != nil || string(buf[:n]) != "0123" {
		t.Fatalf("read %q, %v; want \"0123\"", buf[:n], err)
	}
	n, err = b.Read(buf)
	if err != nil || string(buf[:n]) != "next" {
		t.Fatalf("read %q, %v; want \"next\"", buf[:n], err)
	}
}

func TestErrorsCross(t *testing.T) {
	for _, c := range codes {
		t.Run(c.errno.Error(), func(t *testing.T) {
			a, b := pair(t)
			if ok, err := a.WriteError(&net.OpError{Op: "read", Err: os.NewSyscallError("recvfrom", c.errno)}); !ok || err != nil {
				t.Fatalf("WriteError: %v, %v", ok, err)
			}
			a.Write([]byte("after"))
			buf := make([]byte, 16)
			_, err := b.Read(buf)
			var oe *net.OpError
			if !errors.Is(err, c.errno) || !errors.As(err, &oe) {
				t.Fatalf("read: %v, want a *net.OpError matching %v", err, c.errno)
			}
			if n, err := b.Read(buf); err != nil || string(buf[:n]) != "after" {
				t.Fatalf("the read after the error: %q, %v", buf[:n], err)
			}
		})
	}
	a, _ := pair(t)
	if ok, _ := a.WriteError(syscall.EPERM); ok {
		t.Fatal("EPERM crossed: only what a UDP sender would see does")
	}
}

// A deadline that expires inside a frame leaves it whole for the next
// Read.
func TestDeadlineInsideFrame(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	raw, _ := net.Dial("tcp", ln.Addr().String())
	defer raw.Close()
	s, _ := ln.Accept()
	b := NewConn(s, nil, nil)
	defer b.Close()
	h := makeHeader(frameData, 6)
	raw.Write(append(h[:], "hal"...))
	b.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	buf := make([]byte, 16)
	if _, err := b.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v, want a timeout", err)
	}
	b.SetReadDeadline(time.Time{})
	raw.Write([]byte("ves"))
	if n, err := b.Read(buf); err != nil || string(buf[:n]) != "halves" {
		t.Fatalf("read %q, %v; want \"halves\" whole", buf[:n], err)
	}
}

func TestEnds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bytes []byte
		want  error
	}{
		{"between datagrams", nil, io.EOF},
		{"inside a header", []byte{1, 0}, io.ErrUnexpectedEOF},
		{"inside a datagram", []byte{1, 0, 5, 'a'}, io.ErrUnexpectedEOF},
		{"unknown type", []byte{9, 0, 0}, ErrMalformed},
		{"long error frame", []byte{2, 0, 2, 1, 1}, ErrMalformed},
		{"unknown error code", []byte{2, 0, 1, 99}, ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, _ := net.Listen("tcp", "127.0.0.1:0")
			defer ln.Close()
			raw, _ := net.Dial("tcp", ln.Addr().String())
			s, _ := ln.Accept()
			b := NewConn(s, nil, nil)
			defer b.Close()
			raw.Write(tc.bytes)
			raw.Close()
			_, err := b.Read(make([]byte, 16))
			if !errors.Is(err, tc.want) {
				t.Fatalf("read: %v, want %v", err, tc.want)
			}
		})
	}
}

func TestWriteToConnected(t *testing.T) {
	a, _ := pair(t)
	other := &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 53}
	if _, err := a.WriteTo([]byte("x"), other); !errors.Is(err, net.ErrWriteToConnected) {
		t.Fatalf("WriteTo another address: %v, want ErrWriteToConnected", err)
	}
	if _, err := a.WriteTo([]byte("x"), a.RemoteAddr()); err != nil {
		t.Fatalf("WriteTo the connected address: %v", err)
	}
}

// FuzzConn reads whatever a stream holds: every datagram read fits its
// frame, and nothing panics or reads past the stream.
func FuzzConn(f *testing.F) {
	f.Add([]byte{1, 0, 3, 'a', 'b', 'c', 2, 0, 1, 1})
	f.Add([]byte{1, 255, 255})
	f.Add([]byte{2, 0, 1, 200})
	f.Add([]byte{7})
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := net.Pipe()
		go func() {
			a.Write(data)
			a.Close()
		}()
		c := NewConn(b, nil, nil)
		defer c.Close()
		buf := make([]byte, 512)
		for i := 0; i <= len(data); i++ {
			n, err := c.Read(buf)
			if n > len(buf) || n > len(data) {
				t.Fatalf("read %d bytes of %d", n, len(data))
			}
			if err != nil {
				var oe *net.OpError
				if errors.As(err, &oe) && (errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) ||
					errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, syscall.EMSGSIZE)) {
					continue // a carried socket error: the stream goes on
				}
				return
			}
		}
		t.Fatal("more reads than bytes")
	})
}
