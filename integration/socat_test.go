//go:build linux

package integration

import (
	"bytes"
	"regexp"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// TestSocatPlainClient connects socat, a program that knows nothing of
// VLink, straight to the port of vlink serve: serve must recognize the
// plain connection and forward it to its target, a socat echo server.
func TestSocatPlainClient(t *testing.T) {
	testenv.Programs(t, "socat")
	_, echo := startSocatEcho(t)
	serve, addr := startVLink(t, "serve", "--target", echo, "--log-level", "debug")

	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"empty", nil}, // the client only half-closes: no byte to sniff
		{"1 byte", []byte("x")},
		{"100 KB", genData(100_000, 2)},
		{"16 MiB", genData(16<<20, 3)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// -t: after sending everything, wait for the echo to end.
			got, stderr, err := run(time.Minute, bytes.NewReader(tc.data), "socat", "-t", "60", "-", "TCP:"+addr)
			if err != nil {
				t.Fatalf("socat: %v: %s", err, stderr)
			}
			if len(got) != len(tc.data) || testnet.Sum(got) != testnet.Sum(tc.data) {
				t.Fatalf("socat got back %d bytes sha256 %.16s, sent %d bytes sha256 %.16s", len(got), testnet.Sum(got), len(tc.data), testnet.Sum(tc.data))
			}
		})
	}
	serve.WaitFor(t, regexp.MustCompile(`msg="vlink: accepted plain"`), 5*time.Second)
	if m := regexp.MustCompile(`msg="vlink: accepted" `).FindString(serve.Output()); m != "" {
		t.Errorf("serve took a plain client for a VLink one: %s", m)
	}
}
