package vlink_test

import (
	"testing"

	"github.com/vlink-dev/vlink/vlink"
)

func TestSplitNodeAddr(t *testing.T) {
	tests := []struct {
		in   string
		node string
		port uint16
		ok   bool
	}{
		{"db.vlink.alt:5432", "db", 5432, true},
		{"DB.VLINK.ALT:5432", "db", 5432, true},
		{"db.vlink.alt.:22", "db", 22, true},
		{"web-1.vlink.alt:1", "web-1", 1, true},
		{"db.vlink.alt:0", "", 0, false},
		{"db.vlink.alt:65536", "", 0, false},
		{"db.vlink.alt:ssh", "", 0, false},
		{"db.vlink.alt", "", 0, false},
		{".vlink.alt:1", "", 0, false},
		{"a.b.vlink.alt:1", "", 0, false}, // one label: a node name, not a domain
		{"-a.vlink.alt:1", "", 0, false},
		{"db.vlink.example:1", "", 0, false},
		{"vlink.alt:1", "", 0, false},
		{"[::1]:1", "", 0, false},
		{"db.alt:1", "", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			node, port, ok := vlink.SplitNodeAddr(tt.in)
			if node != tt.node || port != tt.port || ok != tt.ok {
				t.Fatalf("SplitNodeAddr(%q) = %q, %d, %v; want %q, %d, %v", tt.in, node, port, ok, tt.node, tt.port, tt.ok)
			}
		})
	}
}
