package preload

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
)

// BenchmarkExecConnect measures what a connect through the agent costs an
// unmodified program (issue 13, point 10). conntest makes connects blocking
// connects one after the other, each echoing one byte, direct and by each
// route through the lab's gateway (in this process, as the agent and the
// echo server are); rounds interleave the routes. It reports, per route,
// the median over rounds of conntest's median connect() time and of its
// median connect-and-echo time, and the excess of each over the direct
// connect of the same round:
//
//   - tcp: a fresh TCP connection to the gateway and a hello, then the
//     socket itself is passed to the program (descriptor passing);
//   - zstd: the same, relayed by the agent through the filter;
//   - mux: a stream of the agent's established session (lz4 below it),
//     relayed.
//
// Run it with -benchtime=1x: each iteration is a whole measurement.
func BenchmarkExecConnect(b *testing.B) {
	const (
		connects = 300
		rounds   = 7
	)
	shim, prog := needBuilds(b)
	echo := echoServer(b, "tcp4", "127.0.0.1:0")
	_, port, _ := net.SplitHostPort(echo)
	gw, _, _ := gateway(b)
	cfg, err := vlink.NewConfig([]selector.Rule{
		{Host: "127.0.0.2", Stack: "zstd", Via: gw},
		{Host: "127.0.0.3", Stack: "tcp", Via: gw},
		{Host: "127.0.0.5", Stack: "mux+lz4", Via: gw},
	}, selector.Rule{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	a, err := NewAgent(AgentConfig{Config: cfg})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	routes := []struct{ name, host string }{
		{"direct", "127.0.0.1"}, {"tcp", "127.0.0.3"}, {"zstd", "127.0.0.2"}, {"mux", "127.0.0.5"},
	}
	line := regexp.MustCompile(`connect_us=([0-9.]+) connect_p90_us=[0-9.]+ echo_us=([0-9.]+)`)
	measure := func(host string, n int) (connect, echo float64) {
		cmd := exec.Command(prog, "connbench", host, port, strconv.Itoa(n))
		cmd.Env = append(append(os.Environ(), "LD_PRELOAD="+shim), a.Env()...)
		out, err := cmd.CombinedOutput()
		m := line.FindSubmatch(out)
		if err != nil || m == nil {
			b.Fatalf("conntest connbench %s: %v\n%s", host, err, out)
		}
		connect, _ = strconv.ParseFloat(string(m[1]), 64)
		echo, _ = strconv.ParseFloat(string(m[2]), 64)
		return connect, echo
	}
	for range b.N {
		for _, r := range routes {
			measure(r.host, 20) // warm up: the shim's first channel, the mux session
		}
		conn := map[string][]float64{}
		echo := map[string][]float64{}
		for range rounds {
			var direct [2]float64
			for _, r := range routes {
				c, e := measure(r.host, connects)
				if r.name == "direct" {
					direct = [2]float64{c, e}
				}
				conn[r.name] = append(conn[r.name], c)
				conn[r.name+"-extra"] = append(conn[r.name+"-extra"], c-direct[0])
				echo[r.name] = append(echo[r.name], e)
				echo[r.name+"-extra"] = append(echo[r.name+"-extra"], e-direct[1])
			}
		}
		for _, r := range routes {
			c, e := median(conn[r.name]), median(echo[r.name])
			b.Logf("%-6s connect %6.1f µs (%s), +%6.1f µs over direct; connect+echo %6.1f µs, +%6.1f µs",
				r.name, c, spread(conn[r.name]), median(conn[r.name+"-extra"]), e, median(echo[r.name+"-extra"]))
			if r.name != "direct" {
				b.ReportMetric(median(conn[r.name+"-extra"]), r.name+"-extra-µs")
			}
		}
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func spread(v []float64) string {
	s := slices.Clone(v)
	slices.Sort(s)
	return fmt.Sprintf("%.1f..%.1f", s[0], s[len(s)-1])
}
