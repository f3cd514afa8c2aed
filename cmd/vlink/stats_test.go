package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testnet"
	"github.com/vlink-dev/vlink/netconn"
)

// TestStats uploads compressible text through tunnel -> serve with zstd,
// both with --stats, slowly enough for several intervals, and checks
// their one-line reports: the connection opening and closing, the
// throughput up, and a compression ratio on the wire that text gives.
func TestStats(t *testing.T) {
	be := newBackend(t)
	srv := start(t, "serve", "--listen", "127.0.0.1:0", "--target", be.addr(), "--stats", "50ms", "--log-format", "json")
	gw := srv.stderr.waitFor(t, `"msg":"serving","addr":"([^"]+)"`)
	tun := start(t, "tunnel", "--listen", "127.0.0.1:0", "--to", gw, "--stack", "zstd", "--stats", "50ms")
	tunAddr := tun.addr(t)
	var text strings.Builder
	for i := 0; text.Len() < 8<<20; i++ {
		text.WriteString("GET /api/v1/items/" + strconv.Itoa(i%977) + " HTTP/1.1 200 OK user=alice\n")
	}
	up := []byte(text.String())
	got := make(chan int64, 1)
	be.handlers <- func(c net.Conn) {
		n, _ := io.Copy(io.Discard, c)
		got <- n
	}
	c, err := net.Dial("tcp", tunAddr)
	if err != nil {
		t.Fatal(err)
	}
	for len(up) > 0 { // about a second, 20 intervals
		n := min(len(up), 256<<10)
		if _, err := c.Write(up[:n]); err != nil {
			t.Fatal(err)
		}
		up = up[n:]
		time.Sleep(30 * time.Millisecond)
	}
	netconn.CloseWrite(c)
	io.Copy(io.Discard, c)
	c.Close()
	if n := <-got; n != int64(text.Len()) {
		t.Fatalf("backend got %d bytes, want %d", n, text.Len())
	}
	tun.stderr.waitFor(t, `msg=stats .*closed=1`)
	lines := regexp.MustCompile(`msg=stats over=\S+ open=(\d) new=(\d) closed=(\d) failed=0 up="([\d.]+) (\w+)/s" down="[^"]*" bytes_up=\d+ bytes_down=\d+(?: ratio=([\d.]+))?`).
		FindAllStringSubmatch(tun.stderr.String(), -1)
	var opened, closed int
	var ratios []float64
	for _, l := range lines {
		o, _ := strconv.Atoi(l[2])
		cl, _ := strconv.Atoi(l[3])
		opened, closed = opened+o, closed+cl
		if l[6] != "" {
			r, _ := strconv.ParseFloat(l[6], 64)
			ratios = append(ratios, r)
		}
	}
	if len(lines) < 5 || opened != 1 || closed != 1 {
		t.Errorf("%d stats lines, %d connections opened, %d closed; want 5 or more, 1, 1:\n%s", len(lines), opened, closed, tun.stderr.String())
	}
	if len(ratios) == 0 || slices.Max(ratios) < 3 {
		t.Errorf("compression ratios reported for zstd on text: %v, want some above 3:\n%s", ratios, tun.stderr.String())
	}
	// serve logs in JSON, the same figures.
	if !regexp.MustCompile(`\{"time":"[^"]+","level":"INFO","msg":"stats","over":\d+,"open":\d+,"new":\d+,"closed":\d+,"failed":0,"up":"[^"]+","down":"[^"]+","bytes_up":\d+,"bytes_down":\d+`).MatchString(srv.stderr.String()) {
		t.Errorf("serve --log-format json wrote no stats object:\n%s", srv.stderr.String())
	}
}

// TestStatsUDP: a datagram session counts in --stats as a relay in
// progress, and its bytes when it ends (here, idle).
func TestStatsUDP(t *testing.T) {
	echo := testnet.UDPEcho(t).String()
	srv := start(t, "serve", "--listen", "127.0.0.1:0", "--allow-udp", echo, "--log-format", "json")
	gw := srv.stderr.waitFor(t, `"msg":"serving","addr":"([^"]+)"`)
	tun := start(t, "tunnel", "--udp", "--listen", "127.0.0.1:0", "--via", gw, "--to", echo, "--stack", "zstd",
		"--udp-idle-timeout", "300ms", "--stats", "50ms")
	c, err := net.Dial("udp", tun.addr(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 2048)
	for range 5 {
		c.Write(make([]byte, 1000))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	tun.stderr.waitFor(t, `msg=stats over=\S+ open=1 `)
	tun.stderr.waitFor(t, `msg=stats over=\S+ open=0 new=\d closed=1 failed=0 .*bytes_up=5000 bytes_down=5000`)
}

// TestJSONRecords: every record serve and tunnel write with --log-format
// json parses with a strict parser (no key twice in an object), and
// durations are numbers (nanoseconds, as slog writes a time.Duration),
// as is a compression ratio: the stats lines, the SIGUSR1 snapshot of an
// open connection, the connection's end.
func TestJSONRecords(t *testing.T) {
	be := newBackend(t)
	srv := start(t, "serve", "--listen", "127.0.0.1:0", "--target", be.addr(), "--stats", "50ms", "--log-format", "json", "--log-level", "debug")
	gw := srv.stderr.waitFor(t, `"msg":"serving","addr":"([^"]+)"`)
	tun := start(t, "tunnel", "--listen", "127.0.0.1:0", "--to", gw, "--stack", "zstd", "--stats", "50ms", "--log-format", "json", "--log-level", "debug")
	tunAddr := tun.stderr.waitFor(t, `"msg":"listening","addr":"([^"]+)"`)
	release := make(chan struct{})
	be.handlers <- func(c net.Conn) {
		io.Copy(c, io.LimitReader(c, 1000))
		<-release
	}
	c, err := net.Dial("tcp", tunAddr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(bytes.Repeat([]byte("compressible "), 77)[:1000]); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	// Both commands run in this process: one signal, two snapshots.
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	srv.stderr.waitFor(t, `"msg":"open connection"`)
	tun.stderr.waitFor(t, `"msg":"open connection"`)
	close(release)
	c.Close()
	tun.stderr.waitFor(t, `"msg":"connection closed"`)
	tun.stderr.waitFor(t, `"msg":"stats"[^\n]*"closed":1`)
	tun.stop(t)
	srv.stop(t)
	for name, out := range map[string]string{"serve": srv.stderr.String(), "tunnel": tun.stderr.String()} {
		kinds := map[string]bool{}
		for i, line := range strings.Split(strings.TrimSpace(out), "\n") {
			rec, err := strictJSON(line)
			if err != nil {
				t.Errorf("%s, record %d: %v:\n%s", name, i+1, err, line)
				continue
			}
			kinds[fmt.Sprint(rec["msg"])] = true
			for _, k := range []string{"took", "over", "age", "ratio"} {
				if v, ok := rec[k]; ok {
					if _, isNum := v.(json.Number); !isNum {
						t.Errorf("%s, record %d: %q is %T %v, want a number:\n%s", name, i+1, k, v, v, line)
					}
				}
			}
		}
		for _, k := range []string{"stats", "snapshot", "open connection"} {
			if !kinds[k] {
				t.Errorf("%s wrote no %q record:\n%s", name, k, out)
			}
		}
	}
}

// strictJSON decodes one JSON object, refusing a key given twice (which
// encoding/json lets through, keeping the last) and anything after it.
func strictJSON(s string) (map[string]any, error) {
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	var object func() (map[string]any, error)
	var value func() (any, error)
	value = func() (any, error) {
		tok, err := d.Token()
		if err != nil {
			return nil, err
		}
		switch tok {
		case json.Delim('{'):
			return object()
		case json.Delim('['):
			var list []any
			for d.More() {
				v, err := value()
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			_, err := d.Token()
			return list, err
		}
		return tok, nil
	}
	object = func() (map[string]any, error) {
		m := map[string]any{}
		for d.More() {
			k, err := d.Token()
			if err != nil {
				return nil, err
			}
			key := k.(string)
			if _, dup := m[key]; dup {
				return nil, fmt.Errorf("key %q twice", key)
			}
			if m[key], err = value(); err != nil {
				return nil, err
			}
		}
		_, err := d.Token()
		return m, err
	}
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("not a JSON object: %v", err)
	}
	m, err := object()
	if err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("more after the object")
	}
	return m, nil
}
