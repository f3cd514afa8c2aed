package bench

import "testing"

// TestLinkEstimates checks the model on figures chosen for it: a
// compressing stack wins where the link is the limit, raw TCP where the
// CPU is, and raw TCP within 5% of the best is preferred.
func TestLinkEstimates(t *testing.T) {
	rows := []Row{
		{Stack: "raw", Data: "text", MBps: 1000, WirePerByte: 1},
		{Stack: "zstd+tcp", Data: "text", MBps: 100, WirePerByte: 0.2},
		{Stack: "lz4+tcp", Data: "text", MBps: 400, WirePerByte: 0.3},
	}
	links, err := parseLinks("100M, 1G,10g")
	if err != nil {
		t.Fatal(err)
	}
	est := linkEstimates(rows, []string{"text"}, links)
	for i, want := range []struct {
		best    string
		goodput float64
	}{
		{"zstd+tcp", 62.5}, // 12.5 MB/s of wire carry 62.5 of text; zstd's CPU allows 100
		{"lz4+tcp", 400},   // 125/0.3 = 417, but lz4's CPU stops at 400; zstd at 100
		{"raw", 1000},      // 1250/0.3 = 4167 for lz4, CPU 400; raw gets 1000
	} {
		if e := est[i]; e.Best != want.best || e.Goodput[e.Best] != want.goodput {
			t.Errorf("%v bit/s: best %s at %v MB/s, want %s at %v", e.Rate, e.Best, e.Goodput[e.Best], want.best, want.goodput)
		}
	}
	rows[0].MBps = 390 // within 5% of lz4's 400: raw is simpler
	if e := linkEstimates(rows, []string{"text"}, []float64{10e9})[0]; e.Best != "raw" {
		t.Errorf("raw at 390 against lz4 at 400: best %s, want raw", e.Best)
	}
	// deflate's wire ratio a hair better than zstd's, its CPU slower: on
	// a slow link they tie, and the one with CPU to spare is named.
	ties := []Row{
		{Stack: "raw", Data: "text", MBps: 2000, WirePerByte: 1},
		{Stack: "deflate+tcp", Data: "text", MBps: 160, WirePerByte: 0.199},
		{Stack: "zstd+tcp", Data: "text", MBps: 210, WirePerByte: 0.200},
	}
	if e := linkEstimates(ties, []string{"text"}, []float64{10e6})[0]; e.Best != "zstd+tcp" {
		t.Errorf("deflate and zstd tied on 10 Mbit/s: best %s, want zstd+tcp (more CPU to spare)", e.Best)
	}
}

// TestLinkEstimatesNoise decides on recorded spreads: a run where raw
// TCP's rounds spread from 804 to 2005 MB/s named tcp, at 1.09x raw's
// median, for 10 Gbit/s of random data. Within that noise there is no
// difference, and raw TCP is named, saying so; a win the rounds agree on
// stays a win.
func TestLinkEstimatesNoise(t *testing.T) {
	noisy := []Row{
		{Stack: "raw", Data: "random", MBps: 1100, RoundsMBps: []float64{804, 1100, 2005}, WirePerByte: 1},
		{Stack: "tcp", Data: "random", MBps: 1200, RoundsMBps: []float64{1150, 1200, 1250}, WirePerByte: 1.0001},
	}
	e := linkEstimates(noisy, []string{"random"}, []float64{10e9})[0]
	if e.Best != "raw" || !e.NoDifference {
		t.Errorf("tcp's median 1.09x raw's, within raw's 804..2005: best %s (no difference: %v), want raw, no difference", e.Best, e.NoDifference)
	}
	noisy[0].RoundsMBps = []float64{1090, 1100, 1110} // the rounds agree: tcp's 9% is real
	if e := linkEstimates(noisy, []string{"random"}, []float64{10e9})[0]; e.Best != "tcp" || e.NoDifference {
		t.Errorf("raw at 1090..1110 against tcp at 1150..1250: best %s (no difference: %v), want tcp", e.Best, e.NoDifference)
	}
	clear := []Row{
		{Stack: "raw", Data: "text", MBps: 1000, RoundsMBps: []float64{900, 1000, 1100}, WirePerByte: 1},
		{Stack: "zstd+tcp", Data: "text", MBps: 100, RoundsMBps: []float64{60, 100, 110}, WirePerByte: 0.2},
	}
	// On 100 Mbit/s the link caps both: 12.5 MB/s of raw, 62.5 of zstd's
	// text, whatever the rounds did.
	if e := linkEstimates(clear, []string{"text"}, []float64{100e6})[0]; e.Best != "zstd+tcp" || e.NoDifference {
		t.Errorf("zstd at 62.5 MB/s against raw at 12.5 on 100 Mbit/s: best %s (no difference: %v), want zstd+tcp", e.Best, e.NoDifference)
	}
}

func TestParseLinks(t *testing.T) {
	for _, bad := range []string{"fast", "0", "-1M", "100T", "1e20"} {
		if _, err := parseLinks(bad); err == nil {
			t.Errorf("--link %s accepted", bad)
		}
	}
}
