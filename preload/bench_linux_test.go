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
//     relayed;
//   - the "-nb" routes: the same with non-blocking connects, waiting for
//     writability and reading SO_ERROR as event loops do, measured against
//     a non-blocking direct connect. The socket waits on the agent's held
//     listener until the dial is done (held_linux.go), so these cost the
//     dial plus a TCP simultaneous open.
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
	routes := []struct {
		name, host string
		nb         bool
	}{
		{"direct", "127.0.0.1", false}, {"tcp", "127.0.0.3", false}, {"zstd", "127.0.0.2", false}, {"mux", "127.0.0.5", false},
		{"direct-nb", "127.0.0.1", true}, {"zstd-nb", "127.0.0.2", true}, {"mux-nb", "127.0.0.5", true},
	}
	line := regexp.MustCompile(`connect_us=([0-9.]+) connect_p90_us=[0-9.]+ echo_us=([0-9.]+)`)
	measure := func(host string, n int, nb bool) (connect, echo float64) {
		args := []string{"connbench", host, port, strconv.Itoa(n)}
		if nb {
			args = append(args, "nb")
		}
		cmd := exec.Command(prog, args...)
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
			measure(r.host, 20, r.nb) // warm up: the shim's first channel, the mux session
		}
		conn := map[string][]float64{}
		echo := map[string][]float64{}
		for range rounds {
			var direct [2][2]float64 // blocking, non-blocking
			for _, r := range routes {
				c, e := measure(r.host, connects, r.nb)
				mode := 0
				if r.nb {
					mode = 1
				}
				if r.host == "127.0.0.1" {
					direct[mode] = [2]float64{c, e}
				}
				conn[r.name] = append(conn[r.name], c)
				conn[r.name+"-extra"] = append(conn[r.name+"-extra"], c-direct[mode][0])
				echo[r.name] = append(echo[r.name], e)
				echo[r.name+"-extra"] = append(echo[r.name+"-extra"], e-direct[mode][1])
			}
		}
		for _, r := range routes {
			c, e := median(conn[r.name]), median(echo[r.name])
			b.Logf("%-9s connect %6.1f µs (%s), +%6.1f µs over direct; connect+echo %6.1f µs, +%6.1f µs",
				r.name, c, spread(conn[r.name]), median(conn[r.name+"-extra"]), e, median(echo[r.name+"-extra"]))
			if r.host != "127.0.0.1" {
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
