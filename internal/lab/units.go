package lab

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/vlink-dev/vlink/internal/units"
)

// Duration is a time.Duration written as text in topology files ("25ms",
// "1.5s"). The zero value is no delay.
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalText writes d as time.Duration.String does.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText reads a duration as time.ParseDuration does; negative
// durations are errors.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("duration %q: want a number and a unit, like 25ms", b)
	}
	if v < 0 {
		return fmt.Errorf("duration %q is negative", b)
	}
	*d = Duration(v)
	return nil
}

// Bitrate is a link rate in bits per second, written as tc writes it:
// "100mbit", "1gbit", "2.5gbit", "800kbit", or a bare number of bit/s.
// The units are decimal (1mbit = 10^6 bit/s). The zero value means no
// rate limit.
type Bitrate uint64

// Common rates.
const (
	Kbit Bitrate = 1e3
	Mbit Bitrate = 1e6
	Gbit Bitrate = 1e9
)

var rateUnits = []struct {
	suffix string
	mult   Bitrate
}{{"tbit", 1e12}, {"gbit", Gbit}, {"mbit", Mbit}, {"kbit", Kbit}, {"bit", 1}}

// ParseBitrate parses the text form of a Bitrate.
func ParseBitrate(s string) (Bitrate, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	t = strings.TrimSuffix(t, "/s")
	mult := Bitrate(1)
	for _, u := range rateUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v < 0 || math.IsNaN(v) || v*float64(mult) >= 1<<63 {
		return 0, fmt.Errorf("rate %q: want a number and a unit, like 100mbit or 1gbit", s)
	}
	return Bitrate(math.Round(v * float64(mult))), nil
}

// String writes r in the largest unit that keeps it exact to three
// decimals: "100mbit", "2.5gbit", "0" for no limit.
func (r Bitrate) String() string {
	if r == 0 {
		return "0"
	}
	for _, u := range rateUnits {
		if r < u.mult || (u.mult >= 1000 && r%(u.mult/1000) != 0) {
			continue
		}
		return strconv.FormatFloat(float64(r)/float64(u.mult), 'f', -1, 64) + u.suffix
	}
	return strconv.FormatUint(uint64(r), 10) + "bit"
}

// BytesPer returns how many bytes r carries in d.
func (r Bitrate) BytesPer(d time.Duration) int64 {
	return int64(float64(r) / 8 * d.Seconds())
}

func (r Bitrate) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

func (r *Bitrate) UnmarshalText(b []byte) error {
	v, err := ParseBitrate(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// Size is a byte count, written with an optional binary suffix as vlink's
// stack parameters are: "512K", "6M", "1G", or a bare number of bytes.
type Size int64

// ParseSize parses the text form of a Size.
func ParseSize(s string) (Size, error) {
	n, err := units.ParseSize(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("size %q: want a number of bytes with an optional K, M or G", s)
	}
	return Size(n), nil
}

func (s Size) String() string { return units.FormatSize(int64(s)) }

func (s Size) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

func (s *Size) UnmarshalText(b []byte) error {
	v, err := ParseSize(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// Loss is a packet loss probability, a fraction between 0 and 1. Its text
// form is a percentage ("0.1%") or a fraction ("0.001").
type Loss float64

// ParseLoss parses the text form of a Loss.
func ParseLoss(s string) (Loss, error) {
	t := strings.TrimSpace(s)
	pct := strings.HasSuffix(t, "%")
	t = strings.TrimSpace(strings.TrimSuffix(t, "%"))
	v, err := strconv.ParseFloat(t, 64)
	if pct {
		v /= 100
	}
	if err != nil || !(v >= 0 && v <= 1) {
		return 0, fmt.Errorf("loss %q: want a percentage like 0.1%% or a fraction between 0 and 1", s)
	}
	return Loss(v), nil
}

// String writes l as a percentage: "0.1%".
func (l Loss) String() string {
	return strconv.FormatFloat(float64(l)*100, 'g', -1, 64) + "%"
}

func (l Loss) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

func (l *Loss) UnmarshalText(b []byte) error {
	v, err := ParseLoss(string(b))
	if err != nil {
		return err
	}
	*l = v
	return nil
}
