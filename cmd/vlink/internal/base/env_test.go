package base

import "testing"

func TestFormatRate(t *testing.T) {
	for _, tc := range []struct {
		bps  float64
		want string
	}{{0, "0 bit/s"}, {999, "999 bit/s"}, {1500, "1.5 kbit/s"}, {2.5e6, "2.5 Mbit/s"}, {9.61e9, "9.61 Gbit/s"}} {
		if got := FormatRate(tc.bps); got != tc.want {
			t.Errorf("formatRate(%v) = %q, want %q", tc.bps, got, tc.want)
		}
	}
}
