//go:build linux

package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testenv"
	"github.com/vlink-dev/vlink/internal/testnet"
)

// TestCurlDownload downloads a 50 MiB file from python3's http.server with
// curl through a vlink tunnel: over a compressed VLink stack mirrored by
// vlink serve, and over the plain stack straight to the server. What curl
// saves must be the file, byte for byte.
func TestCurlDownload(t *testing.T) {
	testenv.Programs(t, "curl", "python3")
	size := 50 << 20
	if testing.Short() {
		size = 8 << 20
	}
	dir := t.TempDir()
	data := genData(size, 1)
	if err := os.WriteFile(filepath.Join(dir, "data.bin"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	want := testnet.Sum(data)
	_, web := startHTTPServer(t, dir)

	for _, tc := range []struct {
		name  string
		stack string
		serve bool // through vlink serve --target web; else the tunnel goes to web
	}{
		{"zstd", "zstd", true},
		{"lz4", "lz4", true},
		{"adaptive", "adaptive", true},
		{"plain", "tcp", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			to := web
			var serve *proc
			if tc.serve {
				serve, to = startVLink(t, "serve", "--target", web, "--log-level", "debug")
			}
			_, tun := startVLink(t, "tunnel", "--to", to, "--stack", tc.stack)

			out := filepath.Join(t.TempDir(), "got.bin")
			start := time.Now()
			_, stderr, err := run(2*time.Minute, nil, "curl", "-sS", "--fail", "-o", out, "http://"+tun+"/data.bin")
			if err != nil {
				t.Fatalf("curl: %v: %s", err, stderr)
			}
			took := time.Since(start)
			got, n := fileSum(t, out)
			if n != int64(len(data)) || got != want {
				t.Fatalf("curl saved %d bytes sha256 %.16s, the file has %d bytes sha256 %.16s", n, got, len(data), want)
			}
			t.Logf("%d MiB in %v", n>>20, took.Round(time.Millisecond))
			if serve != nil {
				// The download went through the VLink stack, not plain.
				serve.WaitFor(t, regexp.MustCompile(`msg="connection closed".* stack=`+tc.stack+` .*bytes_down=`), 10*time.Second)
			}
		})
	}
}
