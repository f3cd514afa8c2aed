//go:build linux

package integration

import (
	"encoding/json"
	"net"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/vlink-dev/vlink/internal/realserver"
	"github.com/vlink-dev/vlink/internal/testenv"
)

// iperfResult is the part of iperf3's --json report the tests read.
type iperfResult struct {
	Error string `json:"error"`
	End   struct {
		SumSent     iperfSum `json:"sum_sent"`
		SumReceived iperfSum `json:"sum_received"`
	} `json:"end"`
}

type iperfSum struct {
	Bytes         int64   `json:"bytes"`
	BitsPerSecond float64 `json:"bits_per_second"`
}

// runIperf3 runs an iperf3 client against addr and returns its report.
func runIperf3(tb testing.TB, addr string, args ...string) iperfResult {
	tb.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		tb.Fatal(err)
	}
	args = append([]string{"-c", host, "-p", port, "--json"}, args...)
	out, stderr, err := run(2*time.Minute, nil, "iperf3", args...)
	var r iperfResult
	if jerr := json.Unmarshal(out, &r); jerr != nil {
		tb.Fatalf("iperf3 %v: %v, report unreadable (%v): %s%s", args, err, jerr, out, stderr)
	}
	if err != nil || r.Error != "" {
		tb.Fatalf("iperf3 %v: %v, error %q: %s", args, err, r.Error, stderr)
	}
	return r
}

// TestIperf3 runs iperf3 through vlink tunnel --stack zstd and vlink serve,
// in both directions: the control and the data connections go through
// the VLink stack.
func TestIperf3(t *testing.T) {
	testenv.Programs(t, "iperf3")
	_, srv := startIperf3Server(t)
	serve, gw := startVLink(t, "serve", "--target", srv, "--log-level", "debug")
	_, tun := startVLink(t, "tunnel", "--to", gw, "--stack", "zstd")

	for _, tc := range []struct {
		name string
		args []string
	}{
		{"forward", nil},
		{"reverse", []string{"-R"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runIperf3(t, tun, append([]string{"-t", "2"}, tc.args...)...)
			if r.End.SumReceived.Bytes <= 0 || r.End.SumSent.Bytes <= 0 {
				t.Fatalf("iperf3 sent %d bytes and received %d, want both > 0", r.End.SumSent.Bytes, r.End.SumReceived.Bytes)
			}
			t.Logf("sent %d MB, received %d MB, %s Gbit/s", r.End.SumSent.Bytes/1e6, r.End.SumReceived.Bytes/1e6,
				strconv.FormatFloat(r.End.SumReceived.BitsPerSecond/1e9, 'f', 2, 64))
		})
	}
	// Each run opened a control and a data connection; serve must have
	// accepted every one as a VLink connection with the zstd stack, not
	// as a plain one relayed around it.
	accepted := regexp.MustCompile(`msg="vlink: accepted" [^\n]*stack=(\S+)`).FindAllStringSubmatch(serve.Output(), -1)
	if len(accepted) < 4 {
		t.Fatalf("serve accepted %d VLink connections, want at least 4 (two runs of a control and a data connection); log:\n%s",
			len(accepted), realserver.Tail(serve.Output(), 3000))
	}
	for _, m := range accepted {
		if m[1] != "zstd" {
			t.Errorf("serve accepted a connection with the stack %q, want zstd", m[1])
		}
	}
	if m := regexp.MustCompile(`msg="vlink: accepted plain"[^\n]*`).FindString(serve.Output()); m != "" {
		t.Errorf("a connection reached serve without the stack: %s", m)
	}
}
