package netconn

import (
	"bytes"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
)

// TestPipe moves a stream from one socket to another through a Pipe, a
// header written with Send before each payload, and checks what the far
// end reads: the headers and payloads in order, byte for byte.
func TestPipe(t *testing.T) {
	srcW, src := testnet.TCPPair(t)
	dst, dstR := testnet.TCPPair(t)
	srcRC, dstRC := RawSocket(src), RawSocket(dst)
	if srcRC == nil || dstRC == nil {
		t.Fatal("RawSocket of a *net.TCPConn is nil")
	}
	p, err := GetPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Put()

	if n, err := p.Fill(src, srcRC, 1<<10, false); n != 0 || err != nil {
		t.Fatalf("Fill without waiting on an idle socket: %d, %v; want 0, nil", n, err)
	}
	data := testnet.RandomBytes(700<<10, 1)
	go func() {
		srcW.Write(data)
		srcW.CloseWrite()
	}()
	var want bytes.Buffer
	got := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(dstR); got <- b }()
	for off := 0; ; {
		n, err := p.Fill(src, srcRC, 100<<10, true)
		if err == io.EOF {
			break
		}
		if err != nil || n == 0 {
			t.Fatalf("Fill: %d, %v", n, err)
		}
		hdr := []byte{byte(n >> 16), byte(n >> 8), byte(n)}
		if k, err := p.Send(dst, dstRC, hdr); k != len(hdr) || err != nil {
			t.Fatalf("Send: %d, %v", k, err)
		}
		if k, err := p.Drain(dst, dstRC, false); k != n || err != nil || p.Len() != 0 {
			t.Fatalf("Drain: %d of %d, %v; %d left", k, n, err, p.Len())
		}
		want.Write(hdr)
		want.Write(data[off : off+n])
		off += n
	}
	dst.CloseWrite()
	if b := <-got; !bytes.Equal(b, want.Bytes()) {
		t.Errorf("read %d bytes, want %d", len(b), want.Len())
	}
}

// TestPipeReadOut: the bytes a pipe holds come out with ReadOut, as a
// caller whose destination failed takes them back.
func TestPipeReadOut(t *testing.T) {
	srcW, src := testnet.TCPPair(t)
	data := testnet.RandomBytes(50<<10, 2)
	srcW.Write(data)
	p, err := GetPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for len(out) < len(data) {
		n, err := p.Fill(src, RawSocket(src), len(data)-len(out), true)
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, n)
		if k, err := p.ReadOut(b); k != n || err != nil {
			t.Fatalf("ReadOut: %d of %d, %v", k, n, err)
		}
		out = append(out, b...)
	}
	if !bytes.Equal(out, data) || p.Len() != 0 {
		t.Errorf("read out %d bytes, %d left; want the %d written", len(out), p.Len(), len(data))
	}
	p.Put()
}

// TestPipeFillReset: a reset source is an error, as Read reports it,
// never an end of stream.
func TestPipeFillReset(t *testing.T) {
	srcW, src := testnet.TCPPair(t)
	srcW.Write([]byte("x"))
	time.Sleep(20 * time.Millisecond)
	srcW.SetLinger(0)
	srcW.Close()
	p, err := GetPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Put()
	var ferr error
	for range 3 {
		if _, ferr = p.Fill(src, RawSocket(src), 1<<10, true); ferr != nil {
			break
		}
	}
	var op *net.OpError
	if !errors.Is(ferr, syscall.ECONNRESET) || !errors.As(ferr, &op) || op.Op != "read" {
		t.Errorf("Fill from a reset socket: %v; want a read *net.OpError for ECONNRESET", ferr)
	}
	if p.Len() > 1 {
		t.Errorf("%d bytes in the pipe", p.Len())
	}
}
