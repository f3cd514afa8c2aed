package lab

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkCeiling runs the ceiling measurement (vlink-lab ceiling) once
// per iteration, 3 s per run:
//
//	go test -run '^$' -bench Ceiling -benchtime 1x ./internal/lab
func BenchmarkCeiling(b *testing.B) {
	Require(b, "iperf3", "tc")
	for b.Loop() {
		ms, err := Ceiling(context.Background(), CeilingConfig{Time: 3 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		veth, d0 := MaxRate(ms, PathVeth), MaxRate(ms, PathDelay0)
		b.ReportMetric(veth/1e6, "veth-Mbit/s")
		b.ReportMetric(d0/1e6, "delay0-Mbit/s")
		b.ReportMetric(d0/veth, "delay0/veth")
		b.ReportMetric(MaxRate(ms, PathDelay50ms)/1e6, "delay50-Mbit/s")
		b.ReportMetric(float64(Carried(ms))/1e6, "carried-Mbit/s")
	}
}

// BenchmarkBaseline measures iperf3 through the built-in WAN profiles
// with 1 to 16 parallel streams: the reference for what parallel TCP
// does on each link (vlink-lab bench prints the same, with more rounds).
//
//	go test -run '^$' -bench Baseline -benchtime 1x ./internal/lab
func BenchmarkBaseline(b *testing.B) {
	Require(b, "iperf3", "tc")
	for _, profile := range []string{"wan50", "wan50-clean", "wan100m"} {
		b.Run(profile, func(b *testing.B) {
			topo, err := Profile(profile)
			if err != nil {
				b.Fatal(err)
			}
			l := New(b, topo)
			streams := []int{1, 2, 4, 8, 16}
			if profile == "wan100m" {
				streams = []int{1}
			}
			for _, p := range streams {
				b.Run(fmt.Sprintf("P%d", p), func(b *testing.B) {
					for b.Loop() {
						res, err := l.Iperf3(context.Background(), Iperf3{Client: "client", Server: "server", Streams: p, Time: 10 * time.Second})
						if err != nil {
							b.Fatal(err)
						}
						b.ReportMetric(res.Mbps(), "Mbit/s")
						b.ReportMetric(res.CPUPerGB(), "iperf3-cpu-s/GB")
						b.ReportMetric(res.LabCPUPerGB(), "lab-cpu-s/GB")
						b.ReportMetric(float64(res.Retransmits), "retrans")
						b.ReportMetric(float64(res.LateP50.Microseconds()), "late-p50-µs")
					}
				})
			}
		})
	}
}
