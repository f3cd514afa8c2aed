package noise_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/vlink-dev/vlink/vlink"
	_ "github.com/vlink-dev/vlink/vlink/layers"
)

var key = []byte("a pre-shared key of 32 bytes....")

// tap is a TCP relay that records every byte it carries, both ways.
type tap struct {
	addr string
	mu   sync.Mutex
	seen bytes.Buffer
	wg   sync.WaitGroup
}

func newTap(t *testing.T, target string) *tap {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tp := &tap{addr: l.Addr().String()}
	tp.wg.Add(1)
	go func() {
		defer tp.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			tp.wg.Add(2)
			cp := func(dst, src net.Conn) {
				defer tp.wg.Done()
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					tp.mu.Lock()
					tp.seen.Write(buf[:n])
					tp.mu.Unlock()
					if _, werr := dst.Write(buf[:n]); err != nil || werr != nil {
						dst.(*net.TCPConn).CloseWrite()
						return
					}
				}
			}
			go cp(u, c)
			go cp(c, u)
		}
	}()
	t.Cleanup(func() { l.Close(); tp.wg.Wait() })
	return tp
}

// TestThroughVLink runs noise in vlink stacks, checks what each side must
// configure, and that the plaintext never crosses the wire.
func TestThroughVLink(t *testing.T) {
	secret := bytes.Repeat([]byte("top secret payload "), 1000)
	tests := []struct {
		name               string
		stack              string
		dialKey, listenKey []byte
		is                 error
		mention            string // in the error, for a person
	}{
		{"noise", "noise", key, key, nil, ""},
		{"zstd above noise", "zstd+noise", key, key, nil, ""},
		{"noise above mux", "noise+mux", key, key, nil, ""},
		{"noise below parallel", "parallel:streams=2+noise", key, key, nil, ""},
		{"no key to dial", "noise", nil, key, vlink.ErrKeyRequired, "--key-file"},
		{"listener without key", "noise", key, nil, vlink.ErrNotAllowed, "--key-file"},
		{"other key", "noise", key, []byte("another key of enough bytes"), vlink.ErrAuth, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lc := vlink.ListenConfig{Policy: vlink.Policy{Key: tt.listenKey}}
			l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			done := make(chan error, 1)
			go func() {
				c, err := l.Accept()
				if err != nil {
					done <- err
					return
				}
				defer c.Close()
				got, err := io.ReadAll(c)
				if err == nil && !bytes.Equal(got, secret) {
					err = errors.New("the listener read other bytes than were sent")
				}
				done <- err
			}()
			tp := newTap(t, l.Addr().String())
			d := &vlink.Dialer{Stack: vlink.MustParse(tt.stack), Key: tt.dialKey}
			defer d.Close()
			c, err := d.Dial("tcp", tp.addr)
			if tt.is != nil {
				if !errors.Is(err, tt.is) || !strings.Contains(err.Error(), tt.mention) {
					t.Fatalf("dial: %v, want %v mentioning %q", err, tt.is, tt.mention)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Write(secret); err != nil {
				t.Fatal(err)
			}
			c.(interface{ CloseWrite() error }).CloseWrite()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			c.Close()
			tp.mu.Lock()
			defer tp.mu.Unlock()
			if bytes.Contains(tp.seen.Bytes(), []byte("top secret")) {
				t.Fatal("plaintext crossed the wire")
			}
		})
	}
}
