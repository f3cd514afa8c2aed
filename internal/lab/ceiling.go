package lab

import "time"

// CeilingConfig sets up the ceiling measurement.
type CeilingConfig struct {
	// Time of each iperf3 run; 0: 5s.
	Time time.Duration
	// Rounds repeats the whole series, interleaved, for the noise; 0: 1.
	Rounds int
	// Progress, if set, is called after each run.
	Progress func(Measurement)
}

// Labels of the ceiling's paths.
const (
	PathVeth      = "veth"
	PathDelay0    = "delay line, 0 ms"
	PathDelay50ms = "delay line, 50 ms RTT"
)

// ceilingRuns is the series: each delay-line run next to the veth run it
// compares with; then the long path with many streams, unlimited (where
// the line itself is the bottleneck), then rate-limited at increasing
// rates (where it should not be).
var ceilingRuns = []struct {
	label          string
	client, server string
	streams        int
	limit          Bitrate
}{
	{PathVeth, "va", "vb", 1, 0},
	{PathDelay0, "da", "db", 1, 0},
	{PathVeth, "va", "vb", 8, 0},
	{PathDelay0, "da", "db", 8, 0},
	{PathDelay50ms, "wa", "wb", 1, 0},
	{PathDelay50ms, "wa", "wb", 8, 0},
	{PathDelay50ms, "wa", "wb", 16, 0},
	{PathDelay50ms, "wa", "wb", 8, 1 * Gbit},
	{PathDelay50ms, "wa", "wb", 8, 2 * Gbit},
	{PathDelay50ms, "wa", "wb", 8, 4 * Gbit},
}

// CeilingLateLimit is the most the delay line may add to the median
// packet for a rate-limited run to count as carried without the line
// being the bottleneck (2% of the 50 ms RTT). The 99th percentile is
// reported, not judged: on a shared machine it measures the machine's
// stalls (a descheduled vCPU) as much as the line.
const CeilingLateLimit = time.Millisecond

// Carried returns the highest rate limit at which the delay line added
// at most CeilingLateLimit to the median packet while the path delivered
// at least 80% of the limit, in at least half of the rounds; 0 if none.
// The added delay is the judge: how close TCP comes to a rate-limited
// 50 ms path (85-90% with 8 CUBIC flows and a one-BDP buffer) is TCP's
// business; 80% only checks that the path works.
func Carried(ms []Measurement) Bitrate {
	good, runs := map[Bitrate]int{}, map[Bitrate]int{}
	for _, m := range ms {
		if m.Limit == 0 {
			continue
		}
		runs[m.Limit]++
		if m.BitsPerSecond >= 0.8*float64(m.Limit) && m.LateP50 <= CeilingLateLimit {
			good[m.Limit]++
		}
	}
	var best Bitrate
	for r, n := range runs {
		if 2*good[r] >= n {
			best = max(best, r)
		}
	}
	return best
}

// MaxRate returns the highest received rate among the unlimited
// measurements with the given label, in bit/s.
func MaxRate(ms []Measurement, label string) float64 {
	best := 0.0
	for _, m := range ms {
		if m.Label == label && m.Limit == 0 {
			best = max(best, m.BitsPerSecond)
		}
	}
	return best
}
