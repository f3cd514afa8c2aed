package nodename

import (
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"a", true},
		{"alice", true},
		{"web-2", true},
		{"a0-9z", true},
		{strings.Repeat("a", MaxLen), true},
		{"", false},
		{strings.Repeat("a", MaxLen+1), false},
		{"2web", false},
		{"-web", false},
		{"web-", false},
		{"Web", false},
		{"we_b", false},
		{"we.b", false},
		{"wé", false},
		{"we b", false},
	} {
		if got := Valid(tc.name); got != tc.want {
			t.Errorf("Valid(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
}
