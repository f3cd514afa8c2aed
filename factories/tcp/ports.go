package tcp

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"

	"github.com/vlink-dev/vlink/vlink/layer"
)

// ErrNoFreePort is matched by a dial or listen that found every port of
// the factory's range taken.
var ErrNoFreePort = errors.New("no free port in range")

// A PortRange is an inclusive range of TCP ports. The zero value means no
// restriction.
type PortRange struct {
	Lo, Hi uint16
}

// ParsePortRange parses "lo-hi" (or a single port "p") with
// 1 <= lo <= hi <= 65535. Errors match vlink.ErrBadParam.
func ParsePortRange(s string) (PortRange, error) {
	lo, hi, isRange := strings.Cut(s, "-")
	if !isRange {
		hi = lo
	}
	l, errLo := strconv.ParseUint(lo, 10, 16)
	h, errHi := strconv.ParseUint(hi, 10, 16)
	if errLo != nil || errHi != nil {
		return PortRange{}, fmt.Errorf("%w: ports=%q: want a range like 40000-40100", layer.ErrBadParam, s)
	}
	r := PortRange{Lo: uint16(l), Hi: uint16(h)}
	if err := r.check(); err != nil {
		return PortRange{}, err
	}
	return r, nil
}

func (r PortRange) check() error {
	if r.Lo == 0 || r.Lo > r.Hi {
		return fmt.Errorf("%w: ports=%s: want 1 <= low <= high <= 65535", layer.ErrBadParam, r)
	}
	return nil
}

// IsZero reports whether r is the zero value (no restriction).
func (r PortRange) IsZero() bool { return r == PortRange{} }

// Contains reports whether port is in r.
func (r PortRange) Contains(port int) bool { return int(r.Lo) <= port && port <= int(r.Hi) }

// Len is the number of ports in r.
func (r PortRange) Len() int { return int(r.Hi) - int(r.Lo) + 1 }

// String returns "lo-hi", the form ParsePortRange reads.
func (r PortRange) String() string { return fmt.Sprintf("%d-%d", r.Lo, r.Hi) }

// picker returns the range's ports once each in a random order: a random
// start and a random step coprime with the length visit every port
// without allocating a permutation of up to 65535 entries.
func (r PortRange) picker() *portPicker {
	n := r.Len()
	step := 1
	if n > 2 {
		for step = 1 + rand.IntN(n-1); gcd(step, n) != 1; step = 1 + rand.IntN(n-1) {
		}
	}
	return &portPicker{r: r, n: n, pos: rand.IntN(n), step: step}
}

// portPicker hands out ports; the sockets of one Happy Eyeballs race call
// it concurrently.
type portPicker struct {
	mu           sync.Mutex
	r            PortRange
	n, pos, step int
	tried        int
}

func (p *portPicker) next() (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tried == p.n {
		return 0, false
	}
	port := int(p.r.Lo) + p.pos
	p.pos = (p.pos + p.step) % p.n
	p.tried++
	return port, true
}

func (p *portPicker) left() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n - p.tried
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
