//go:build linux

package integration

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/testenv"
)

// scrapeMetrics fetches a /metrics page: value by series, written as the
// exposition writes it (name{label="v",...}).
func scrapeMetrics(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	series := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad metrics line %q", line)
		}
		series[line[:i]] = v
	}
	return series
}

var metricsAddrRE = regexp.MustCompile(`msg="serving metrics" addr=http://(\S+)/metrics`)

// metered starts a gateway in front of echo and a tunnel to it through
// stack, both with --metrics, and returns the tunnel's address and both
// metrics addresses.
func metered(t *testing.T, echo, stack string) (tunnel, tunMetrics, gwMetrics string) {
	t.Helper()
	gw, gwAddr := startVLink(t, "serve", "--target", echo, "--metrics", "127.0.0.1:0")
	tun, tunAddr := startVLink(t, "tunnel", "--to", gwAddr, "--stack", stack, "--metrics", "127.0.0.1:0")
	return tunAddr, tun.WaitFor(t, metricsAddrRE, startTimeout)[1], gw.WaitFor(t, metricsAddrRE, startTimeout)[1]
}

// TestLayerMetrics carries known bytes through real tunnels and gateways
// and checks the layers' own figures their metrics report: bytes each
// way and on the wire for compression, the adaptive layer's settings,
// mux sessions and streams, parallel sessions and substreams.
func TestLayerMetrics(t *testing.T) {
	testenv.Programs(t, "socat")
	_, echo := startSocatEcho(t)
	const size = 1 << 20
	data := genData(size, 7) // half text, half random

	t.Run("zstd", func(t *testing.T) {
		tun, tm, gm := metered(t, echo, "zstd")
		checkEcho(t, tun, data)
		a, b := scrapeMetrics(t, tm), scrapeMetrics(t, gm)
		for _, want := range []struct {
			who    string
			m      map[string]float64
			series string
		}{
			{"tunnel", a, `vlink_compress_application_bytes_total{direction="out",layer="zstd"}`},
			{"tunnel", a, `vlink_compress_application_bytes_total{direction="in",layer="zstd"}`},
			{"gateway", b, `vlink_compress_application_bytes_total{direction="in",layer="zstd"}`},
			{"gateway", b, `vlink_compress_application_bytes_total{direction="out",layer="zstd"}`},
		} {
			if got := want.m[want.series]; got != size {
				t.Errorf("%s: %s = %v, want %d", want.who, want.series, got, size)
			}
		}
		out, in := a[`vlink_compress_wire_bytes_total{direction="out",layer="zstd"}`], b[`vlink_compress_wire_bytes_total{direction="in",layer="zstd"}`]
		if out != in || out <= size/2 || out >= 0.7*size {
			t.Errorf("wire bytes: the tunnel sent %v, the gateway received %v; want equal, between half (the random half) and 0.7 of %d", out, in, size)
		}
		if a[`vlink_compress_application_bytes_total{direction="out",layer="lz4"}`] != 0 {
			t.Errorf("lz4 counted bytes it never carried")
		}
	})

	t.Run("adaptive", func(t *testing.T) {
		tun, tm, _ := metered(t, echo, "adaptive")
		checkEcho(t, tun, data)
		m := scrapeMetrics(t, tm)
		var rungs float64
		for k, v := range m {
			if strings.HasPrefix(k, "vlink_adaptive_rung_bytes_total{") {
				rungs += v
			}
		}
		if out := m[`vlink_compress_application_bytes_total{direction="out",layer="adaptive"}`]; out != size || rungs != size {
			t.Errorf("adaptive wrote %v bytes, %v of them at some rung; want %d both", out, rungs, size)
		}
		if _, ok := m["vlink_adaptive_moves_total"]; !ok {
			t.Errorf("no vlink_adaptive_moves_total")
		}
	})

	t.Run("mux", func(t *testing.T) {
		tun, tm, gm := metered(t, echo, "mux+lz4")
		var conns []net.Conn
		for range 3 {
			c, err := net.Dial("tcp", tun)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			roundTrip(t, c, data[:4096])
			conns = append(conns, c)
		}
		want := map[string]float64{"vlink_mux_sessions_total": 1, "vlink_mux_sessions_open": 1,
			"vlink_mux_streams_total": 3, "vlink_mux_streams_open": 3}
		waitSeries(t, "tunnel", tm, want)
		waitSeries(t, "gateway", gm, want)
		for _, c := range conns {
			c.Close()
		}
		want["vlink_mux_streams_open"] = 0
		waitSeries(t, "tunnel", tm, want)
		waitSeries(t, "gateway", gm, want)
	})

	t.Run("parallel", func(t *testing.T) {
		tun, tm, gm := metered(t, echo, "parallel:streams=3")
		checkEcho(t, tun, data)
		want := map[string]float64{"vlink_parallel_sessions_total": 1, "vlink_parallel_sessions_open": 0,
			"vlink_parallel_substreams_total": 3}
		waitSeries(t, "tunnel", tm, want)
		waitSeries(t, "gateway", gm, want)
	})
}

// waitSeries scrapes addr until every series in want has its value.
func waitSeries(t *testing.T, who, addr string, want map[string]float64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		got := scrapeMetrics(t, addr)
		var wrong []string
		for k, v := range want {
			if got[k] != v {
				wrong = append(wrong, fmt.Sprintf("%s = %v, want %v", k, got[k], v))
			}
		}
		if len(wrong) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's metrics:\n%s", who, strings.Join(wrong, "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
