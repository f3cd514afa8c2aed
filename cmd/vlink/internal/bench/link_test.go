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
	for _, bad := range []string{"fast", "0", "-1M", "100T", "1e20"} {
		if _, err := parseLinks(bad); err == nil {
			t.Errorf("--link %s accepted", bad)
		}
	}
}
