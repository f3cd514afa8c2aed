package lab

import (
	"context"
	"time"
)

// Ceiling measures the highest rate the delay line carries: iperf3
// through a delay line with no delay next to a veth pair (what the
// kernel alone does, in the same run), then through a 50 ms delay line
// with 1, 8 and 16 streams. No rate limit anywhere. Figures taken
// through the lab are only trustworthy well below this ceiling. Last,
// the 50 ms line is rate-limited at 1, 2 and 4 Gbit/s: Carried tells the
// highest of those it delivered with little added delay.
func Ceiling(ctx context.Context, cfg CeilingConfig) ([]Measurement, error) {
	topo, err := Profile("ceiling")
	if err != nil {
		return nil, err
	}
	l, err := Up(ctx, topo)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	dur := cfg.Time
	if dur == 0 {
		dur = 5 * time.Second
	}
	var out []Measurement
	for range max(cfg.Rounds, 1) {
		for _, r := range ceilingRuns {
			half := Shape{Delay: Duration(25 * time.Millisecond), Rate: r.limit}
			if r.client == "wa" {
				if err := l.SetLink(ctx, "wa", "wb", half, half); err != nil {
					return out, err
				}
			}
			res, err := l.Iperf3(ctx, Iperf3{Client: r.client, Server: r.server, Streams: r.streams, Time: dur})
			if err != nil {
				return out, err
			}
			m := Measurement{Label: r.label, Streams: r.streams, Limit: r.limit, Iperf3Result: res}
			out = append(out, m)
			if cfg.Progress != nil {
				cfg.Progress(m)
			}
		}
	}
	return out, nil
}
