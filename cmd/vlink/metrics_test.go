package main

import (
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
	"github.com/vlink-dev/vlink/vlink"
)

// TestMetrics carries connections through tunnel and serve, both with
// --metrics, has serve refuse a dialer with the wrong key and the tunnel
// fail to reach a stopped server, and checks what a Prometheus scrape
// of each reports.
func TestMetrics(t *testing.T) {
	const upSize, downSize, conns = 300<<10 + 1, 200<<10 + 3, 3
	be := newBackend(t)
	key := writeKey(t)
	srv := start(t, "serve", "--listen", "127.0.0.1:0", "--target", be.addr(), "--key-file", key, "--metrics", "127.0.0.1:0")
	srvMetrics := srv.stderr.waitFor(t, `msg="serving metrics" addr=(\S+)`)
	gw := srv.addr(t)
	tun := start(t, "tunnel", "--listen", "127.0.0.1:0", "--to", gw, "--stack", "zstd:level=3", "--key-file", key,
		"--known-nodes", "none", "--metrics", "127.0.0.1:0")
	tunMetrics := tun.stderr.waitFor(t, `msg="serving metrics" addr=(\S+)`)
	tunAddr := tun.addr(t)

	up, down := testnet.RandomBytes(upSize, 1), testnet.RandomBytes(downSize, 2)
	for range conns {
		be.handlers <- func(c net.Conn) {
			h := sha256.New()
			if n, err := io.Copy(h, c); err != nil || n != upSize || [32]byte(h.Sum(nil)) != sha256.Sum256(up) {
				t.Errorf("backend: %d bytes, %v", n, err)
			}
			c.Write(down)
		}
		c, err := net.Dial("tcp", tunAddr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write(up)
		netconn.CloseWrite(c)
		if got, err := io.ReadAll(c); err != nil || len(got) != downSize {
			t.Fatalf("client: %d bytes, %v", len(got), err)
		}
		c.Close()
	}
	// Through a multi-link layer: the session's connection is taken over
	// by the layer (Observe is told no connection), its stream is served.
	be.handlers <- func(c net.Conn) { io.Copy(c, c) }
	keyBytes, err := vlink.ReadKeyFile(key)
	if err != nil {
		t.Fatal(err)
	}
	muxed := vlink.Dialer{Stack: vlink.MustParse("zstd+mux"), Key: keyBytes}
	mc, err := muxed.Dial("tcp", gw)
	if err != nil {
		t.Fatal(err)
	}
	testnet.RoundTrip(t, mc, 1000)
	mc.Close()
	muxed.Close()
	// A dialer with the wrong key, and a plain client, both refused.
	bad := vlink.Dialer{Stack: vlink.MustParse("zstd"), Key: []byte("not the key, 16 bytes or more")}
	if c, err := bad.Dial("tcp", gw); err == nil {
		c.Close()
		t.Fatal("serve accepted the wrong key")
	}
	if c, err := net.Dial("tcp", gw); err == nil {
		c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
		io.Copy(io.Discard, c)
		c.Close()
	}

	got := testnet.WaitMetrics(t, "serve", srvMetrics, map[string]float64{
		`vlink_connections_total{forward="127.0.0.1:0",outcome="ok",stack="zstd",transport="tcp"}`: conns,
		`vlink_connections_open{forward="127.0.0.1:0",stack="zstd",transport="tcp"}`:               0,
		`vlink_bytes_total{direction="up",forward="127.0.0.1:0",stack="zstd",transport="tcp"}`:     conns * upSize,
		`vlink_bytes_total{direction="down",forward="127.0.0.1:0",stack="zstd",transport="tcp"}`:   conns * downSize,
		`vlink_refusals_total{reason="authentication_failed"}`:                                     1,
		`vlink_refusals_total{reason="plain_refused"}`:                                             1,
		`vlink_handshake_duration_seconds_count{outcome="ok",stack="zstd"}`:                        conns,
		`vlink_handshake_duration_seconds_count{outcome="authentication_failed",stack="zstd"}`:     1,
		`vlink_handshake_duration_seconds_count{outcome="plain_refused",stack="plain"}`:            1,
		// The mux stream as its dialer spells it, the session's member
		// apart.
		`vlink_connections_total{forward="127.0.0.1:0",outcome="ok",stack="zstd+mux",transport="tcp"}`: 1,
		`vlink_handshake_duration_seconds_count{outcome="ok",stack="zstd+mux"}`:                        1,
		`vlink_handshake_duration_seconds_count{outcome="ok",stack="member"}`:                          1,
	})
	if _, ok := got[`go_goroutines`]; !ok {
		t.Errorf("serve's metrics have no Go runtime metrics")
	}
	testnet.WaitMetrics(t, "tunnel", tunMetrics, map[string]float64{
		// The same spelling of the stack as serve's.
		`vlink_connections_total{forward="127.0.0.1:0",outcome="ok",stack="zstd",transport="tcp"}`: conns,
		`vlink_bytes_total{direction="up",forward="127.0.0.1:0",stack="zstd",transport="tcp"}`:     conns * upSize,
		`vlink_bytes_total{direction="down",forward="127.0.0.1:0",stack="zstd",transport="tcp"}`:   conns * downSize,
		`vlink_dial_duration_seconds_count{forward="127.0.0.1:0",stack="zstd",transport="tcp"}`:    conns,
	})

	// With serve gone, the tunnel's dials fail.
	srv.stop(t)
	if c, err := net.Dial("tcp", tunAddr); err == nil {
		io.Copy(io.Discard, c)
		c.Close()
	}
	testnet.WaitMetrics(t, "tunnel", tunMetrics, map[string]float64{
		`vlink_connections_total{forward="127.0.0.1:0",outcome="unreachable",stack="zstd",transport="none"}`: 1,
	})
	// The metrics listener goes with its command.
	tun.stop(t)
	if _, err := http.Get(tunMetrics); err == nil {
		t.Errorf("the tunnel's metrics are still served after it stopped")
	}
}

// TestMetricsHealthAndReload: /healthz answers ok, vlink_build_info is
// served, and with --forwards the reload gauges follow each reading of
// the file: 1 at the start, 0 for a file refused on SIGHUP, 1 again once
// one applies.
func TestMetricsHealthAndReload(t *testing.T) {
	be := newBackend(t)
	file := filepath.Join(t.TempDir(), "forwards.toml")
	good := fmt.Sprintf("[[forward]]\nlisten = \"127.0.0.1:0\"\nto = %q\n", be.addr())
	write := func(s string) {
		if err := os.WriteFile(file, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(good)
	tun := start(t, "tunnel", "--forwards", file, "--metrics", "127.0.0.1:0")
	url := tun.stderr.waitFor(t, `msg="serving metrics" addr=(\S+)`)
	tun.stderr.waitFor(t, `msg="running forwards"()`) // SIGHUP is handled from here on
	got := testnet.WaitMetrics(t, "tunnel", url, map[string]float64{"vlink_config_last_reload_successful": 1})
	if at := got["vlink_config_last_reload_success_timestamp_seconds"]; at < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Errorf("last reload at %v, want about now", at)
	}
	built := false
	for k, v := range got {
		built = built || strings.HasPrefix(k, "vlink_build_info{") && strings.Contains(k, `goversion="go`) && v == 1
	}
	if !built {
		t.Errorf("no vlink_build_info with the Go version")
	}
	resp, err := http.Get(strings.TrimSuffix(url, "/metrics") + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "ok\n" {
		t.Errorf("/healthz: %d %q, want 200 ok", resp.StatusCode, body)
	}

	write("[[forward]]\nlisten = \"127.0.0.1:0\"\nto = \"no port\"\n")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testnet.WaitMetrics(t, "tunnel", url, map[string]float64{"vlink_config_last_reload_successful": 0})
	write(good)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testnet.WaitMetrics(t, "tunnel", url, map[string]float64{"vlink_config_last_reload_successful": 1})
}

// TestMetricsLabels: two forwards of one tunnel on the same stack, one
// over TCP and one over shared memory, into one serve: each side counts
// them apart by forward (its name in the file, else its listen address)
// and by the transport they took, and spells the stack the same way.
func TestMetricsLabels(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("shared memory is Linux's")
	}
	be := newBackend(t)
	key := writeKey(t)
	srv := start(t, "serve", "--listen", "127.0.0.1:0", "--shm", "--target", be.addr(), "--key-file", key, "--metrics", "127.0.0.1:0")
	srvMetrics := srv.stderr.waitFor(t, `msg="serving metrics" addr=(\S+)`)
	gw := srv.addr(t)
	ports, names := [2]string{}, [2]string{}
	file := filepath.Join(t.TempDir(), "forwards.toml")
	var text strings.Builder
	// A tcp factory with a parameter keeps to TCP (a bare one would take
	// the shared memory serve offers). The first forward is named: that
	// is its label; the second's is its listen address.
	for i, stack := range []string{"zstd+tcp:nodelay=true", "zstd+shm"} {
		ports[i] = fmt.Sprintf("127.0.0.1:%d", realserver.FreePort(t))
		names[i] = ports[i]
		if i == 0 {
			names[i] = "by tcp"
			fmt.Fprintf(&text, "[[forward]]\nname = %q\n", names[i])
		} else {
			text.WriteString("[[forward]]\n")
		}
		fmt.Fprintf(&text, "listen = %q\nto = %q\nstack = %q\nkey_file = %q\nknown_nodes = \"none\"\n", ports[i], gw, stack, key)
	}
	if err := os.WriteFile(file, []byte(text.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	tun := start(t, "tunnel", "--forwards", file, "--metrics", "127.0.0.1:0")
	tunMetrics := tun.stderr.waitFor(t, `msg="serving metrics" addr=(\S+)`)
	tun.stderr.waitFor(t, `msg="running forwards"()`)
	const size = 100<<10 + 9
	data := testnet.RandomBytes(size, 3)
	for _, addr := range ports {
		be.handlers <- func(c net.Conn) {
			if n, err := io.Copy(io.Discard, c); err != nil || n != size {
				t.Errorf("backend: %d bytes, %v", n, err)
			}
		}
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write(data)
		netconn.CloseWrite(c)
		io.Copy(io.Discard, c)
		c.Close()
	}
	want := map[string]float64{}
	for i, transport := range []string{"tcp", "shm"} {
		want[fmt.Sprintf(`vlink_connections_total{forward=%q,outcome="ok",stack="zstd",transport=%q}`, names[i], transport)] = 1
		want[fmt.Sprintf(`vlink_bytes_total{direction="up",forward=%q,stack="zstd",transport=%q}`, names[i], transport)] = size
	}
	testnet.WaitMetrics(t, "tunnel", tunMetrics, want)
	testnet.WaitMetrics(t, "serve", srvMetrics, map[string]float64{
		`vlink_connections_total{forward="127.0.0.1:0",outcome="ok",stack="zstd",transport="tcp"}`: 1,
		`vlink_connections_total{forward="127.0.0.1:0",outcome="ok",stack="zstd",transport="shm"}`: 1,
		`vlink_bytes_total{direction="up",forward="127.0.0.1:0",stack="zstd",transport="shm"}`:     size,
	})
}
