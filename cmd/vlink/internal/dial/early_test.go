package dial

import (
	"bytes"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
)

// TestReadEarly: what a tunnel sends with the hello is what its client
// wrote within the wait, nothing if it wrote nothing or ended its side;
// a client that reset fails, since a later read could say EOF instead.
func TestReadEarly(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sends []byte // before the read; the read returns it
	}{
		{"a request", []byte("GET / HTTP/1.1\r\n\r\n")},
		{"nothing yet", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, server := testnet.TCPPair(t)
			client.Write(tc.sends)
			got, err := readEarly(server, 20*time.Millisecond)
			if !bytes.Equal(got, tc.sends) || err != nil {
				t.Fatalf("read %q, %v; want %q", got, err, tc.sends)
			}
			// The connection reads on, with no deadline left.
			client.Write([]byte("more"))
			var b [4]byte
			if _, err := server.Read(b[:]); err != nil || string(b[:]) != "more" {
				t.Fatalf("then read %q, %v; want more", b, err)
			}
		})
	}
	t.Run("an end", func(t *testing.T) {
		client, server := testnet.TCPPair(t)
		client.CloseWrite()
		if got, err := readEarly(server, time.Second); len(got) != 0 || err != nil {
			t.Fatalf("read %q, %v; want nothing, no error", got, err)
		}
	})
	t.Run("a reset", func(t *testing.T) {
		client, server := testnet.TCPPair(t)
		client.SetLinger(0)
		client.Close()
		if _, err := readEarly(server, time.Second); !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("read: %v, want ECONNRESET", err)
		}
	})
}
