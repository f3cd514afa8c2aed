package lab

import (
	"fmt"
	"sort"
	"strings"
)

// TCPSysctls are the TCP settings every built-in profile sets in each
// host: buffers that autotune up to 64 MiB (ten times the 6.25 MB that
// 1 Gbit/s × 50 ms holds, so the window never caps a stream below the
// link; the kernel's default maximum of 4 MiB for sending would), CUBIC
// (Linux's default, whose reaction to loss is what the WAN profiles are
// about; this machine's default is BBR), and no cached metrics, so that
// one run's losses do not lower the next connection's ssthresh.
var TCPSysctls = map[string]string{
	"net.ipv4.tcp_rmem":               "4096 131072 67108864",
	"net.ipv4.tcp_wmem":               "4096 16384 67108864",
	"net.ipv4.tcp_congestion_control": "cubic",
	"net.ipv4.tcp_no_metrics_save":    "1",
}

// The rate of the 50 ms profiles: the delay line carries well over it
// (docs/BENCHMARKS.md §4 has its ceiling), and 6.25 MB in flight per
// direction is a real long fat pipe.
const wanRate = Gbit

func pair(name, about string, l Link) Topology {
	l.A, l.B = "client", "server"
	return Topology{
		Name:    name,
		About:   about,
		Hosts:   []Host{{Name: "client"}, {Name: "server"}},
		Links:   []Link{l},
		Sysctls: TCPSysctls,
	}
}

var profiles = map[string]func() Topology{
	"lan": func() Topology {
		return pair("lan", "client and server on a veth pair: no delay, no limit (the baseline)", Link{})
	},
	"wan50": func() Topology {
		return pair("wan50", "1 Gbit/s, 50 ms RTT, 0.1% loss each way: a long, lossy path",
			Link{Rate: wanRate, RTT: Duration(50e6), Loss: 0.001})
	},
	"wan50-clean": func() Topology {
		return pair("wan50-clean", "1 Gbit/s, 50 ms RTT, no loss: a long, clean path",
			Link{Rate: wanRate, RTT: Duration(50e6)})
	},
	"wan50-capped": func() Topology {
		return pair("wan50-capped", "1 Gbit/s, 50 ms RTT, no loss, each flow shaped to at most 100 Mbit/s: a path whose shaper caps every TCP connection",
			Link{Rate: wanRate, FlowRate: 100 * Mbit, RTT: Duration(50e6)})
	},
	"wan100m": func() Topology {
		return pair("wan100m", "100 Mbit/s, 20 ms RTT, no loss: a link slower than the CPU (for compression)",
			Link{Rate: 100 * Mbit, RTT: Duration(20e6)})
	},
	"firewall": func() Topology {
		return Topology{
			Name:  "firewall",
			About: "client behind host fw, a stateful firewall that lets the client's connections out and nothing new in; fw-server is 20 ms RTT",
			Hosts: []Host{
				{Name: "client"},
				{Name: "fw", Firewall: &Firewall{Trust: []string{"client"}}},
				{Name: "server"},
			},
			Links: []Link{
				{A: "client", B: "fw"},
				{A: "fw", B: "server", RTT: Duration(20e6)},
			},
			Sysctls: TCPSysctls,
		}
	},
	"ceiling": func() Topology {
		return Topology{
			Name:  "ceiling",
			About: "three pairs for the ceiling measurement: va-vb a veth pair, da-db a delay line with no delay, wa-wb a delay line with 50 ms RTT; none rate-limited",
			Hosts: []Host{{Name: "va"}, {Name: "vb"}, {Name: "da"}, {Name: "db"}, {Name: "wa"}, {Name: "wb"}},
			Links: []Link{
				{A: "va", B: "vb"},
				{A: "da", B: "db", DelayLine: true},
				{A: "wa", B: "wb", RTT: Duration(50e6)},
			},
			Sysctls: TCPSysctls,
		}
	},
}

// Profiles returns the names of the built-in topologies, sorted.
func Profiles() []string {
	names := make([]string, 0, len(profiles))
	for n := range profiles {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Profile returns a copy of the built-in topology name.
func Profile(name string) (Topology, error) {
	f, ok := profiles[name]
	if !ok {
		return Topology{}, fmt.Errorf("no profile %q (known: %s)", name, strings.Join(Profiles(), ", "))
	}
	t := f()
	// callers may change the copy; the shared map must stay as it is
	s := make(map[string]string, len(t.Sysctls))
	for k, v := range t.Sysctls {
		s[k] = v
	}
	t.Sysctls = s
	return t, nil
}
