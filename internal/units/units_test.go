package units

import (
	"errors"
	"testing"
)

func TestParseSize(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int64
	}{
		{"0", 0}, {"512", 512}, {"64K", 64 << 10}, {"64k", 64 << 10},
		{"6M", 6 << 20}, {"1G", 1 << 30}, {"3g", 3 << 30},
	} {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSize(tt.in)
			if err != nil || got != tt.want {
				t.Fatalf("ParseSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
			}
			if back, err := ParseSize(FormatSize(got)); err != nil || back != got {
				t.Fatalf("ParseSize(FormatSize(%d) = %q) = %d, %v", got, FormatSize(got), back, err)
			}
		})
	}
	for _, bad := range []string{"", "K", "-1", "1.5M", "1T", "1 M", "9999999999G", "0x10"} {
		t.Run("bad "+bad, func(t *testing.T) {
			if n, err := ParseSize(bad); !errors.Is(err, ErrSize) {
				t.Fatalf("ParseSize(%q) = %d, %v; want ErrSize", bad, n, err)
			}
		})
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 1000: "1000", 1024: "1K", 1536: "1536", 1 << 20: "1M", 5 << 30: "5G"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"64K", "1G", "", "-1", "9999999999G"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			return
		}
		if n < 0 {
			t.Fatalf("ParseSize(%q) = %d", s, n)
		}
		if back, err := ParseSize(FormatSize(n)); err != nil || back != n {
			t.Fatalf("round trip of %d: %d, %v", n, back, err)
		}
	})
}
