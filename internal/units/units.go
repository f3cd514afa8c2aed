// Package units reads and writes the byte counts that stack parameters,
// flags and lab topologies share: a number with an optional K, M or G
// suffix, powers of 1024, as in "64K", "6M", "1G".
package units

import (
	"errors"
	"strconv"
)

// ErrSize is matched by the error of a text that is not a size.
var ErrSize = errors.New("not a size like 64K (a number of bytes with an optional K, M or G: powers of 1024)")

// maxSize keeps n*multiplier well inside int64.
const maxSize = 1 << 62

// ParseSize returns the number of bytes s stands for.
func ParseSize(s string) (int64, error) {
	mult := int64(1)
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'k', 'K':
			mult, s = 1<<10, s[:n-1]
		case 'm', 'M':
			mult, s = 1<<20, s[:n-1]
		case 'g', 'G':
			mult, s = 1<<30, s[:n-1]
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > maxSize/mult {
		return 0, ErrSize
	}
	return n * mult, nil
}

// FormatSize writes n with the largest suffix that divides it exactly, so
// ParseSize(FormatSize(n)) == n.
func FormatSize(n int64) string {
	switch {
	case n != 0 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + "G"
	case n != 0 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + "M"
	case n != 0 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + "K"
	}
	return strconv.FormatInt(n, 10)
}
