package quic

import (
	"strings"
	"testing"
)

// FuzzParsePin: a pin is user input (a stack parameter). Whatever it
// is, ParsePin accepts it only as SHA256: and 32 bytes, and what it
// accepts writes back to a pin that parses to the same bytes.
func FuzzParsePin(f *testing.F) {
	var p Pin
	for i := range p {
		p[i] = byte(i * 7)
	}
	f.Add(p.String())
	f.Add("SHA256:")
	f.Add("sha256:" + p.String()[7:])
	f.Add("SHA256:" + strings.Repeat("A", 43))
	f.Add("SHA256:" + strings.Repeat("/", 43))
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePin(s)
		if err != nil {
			return
		}
		if !strings.HasPrefix(s, pinPrefix) {
			t.Fatalf("accepted %q without the prefix", s)
		}
		q, err := ParsePin(p.String())
		if err != nil || q != p {
			t.Fatalf("%q: parsed to %v, which parses back to %v, %v", s, p, q, err)
		}
	})
}
