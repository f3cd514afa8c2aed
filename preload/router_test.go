package preload

import (
	"testing"

	"github.com/vlink-dev/vlink/selector"
	"github.com/vlink-dev/vlink/vlink"
	_ "github.com/vlink-dev/vlink/vlink/layers"
)

func TestRouter(t *testing.T) {
	cfg, err := vlink.NewConfig([]selector.Rule{
		{Host: "web.corp.test", Ports: "80", Action: selector.Direct},
		{Host: "*.corp.test", Stack: "zstd", Via: "gw:7000"},
		{Host: "*.lan", Ports: "22", Stack: "lz4", Via: "gw:7000"},
		{Host: "*.lan", Action: selector.Direct},
		{Host: "bad.test", Action: selector.Refuse},
	}, selector.Rule{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !r.ipsDirect {
		t.Error("no rule routes IP addresses, yet ipsDirect is false")
	}
	for _, tc := range []struct {
		name   string
		port   uint16
		routed bool
	}{
		{"web.corp.test", 80, false},
		{"web.corp.test", 443, true},
		{"web.corp.test", 0, true}, // some port of it is routed
		{"db.corp.test", 0, true},
		{"box.lan", 22, true},
		{"box.lan", 80, false},
		{"box.lan", 0, true},
		{"example.org", 0, false},
		{"bad.test", 0, true}, // refused: no DNS query for it
	} {
		if got := r.nameRouted(tc.name, tc.port); got != tc.routed {
			t.Errorf("nameRouted(%s, %d) = %v, want %v", tc.name, tc.port, got, tc.routed)
		}
	}
	d, err := r.decide("db.corp.test:5432")
	if err != nil || d.rule.Action != selector.Stack || d.stack.String() != "zstd+tcp" || d.rule.Via != "gw:7000" {
		t.Errorf("decide(db.corp.test:5432) = %+v, %v", d, err)
	}

	everything, err := vlink.NewConfig([]selector.Rule{{Host: "127.0.0.0/8", Action: selector.Direct}},
		selector.Rule{Stack: "zstd", Via: "gw:7000"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err = newRouter(everything)
	if err != nil {
		t.Fatal(err)
	}
	if r.ipsDirect || !r.nameRouted("anything.test", 0) {
		t.Error("a default stack routes IP addresses and names")
	}
	if d, _ := r.decide("127.0.0.1:80"); d.rule.Action != selector.Direct {
		t.Errorf("loopback: %v", d.rule)
	}

	r, err = newRouter(nil)
	if err != nil || !r.ipsDirect || r.nameRouted("x.test", 0) {
		t.Errorf("the zero config must send everything direct: %v", err)
	}
}

// TestRouterNodes: a node's address (NODE.vlink.alt:PORT) goes through
// the network whatever the rules say, with the matching rule's stack and
// never its gateway; its name is never left to the DNS; a refusal holds.
func TestRouterNodes(t *testing.T) {
	cfg, err := vlink.NewConfig([]selector.Rule{
		{Host: "db.vlink.alt", Stack: "zstd", Via: "gw:7000"},
		{Host: "bad.vlink.alt", Action: selector.Refuse},
	}, selector.Rule{Action: selector.Direct}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRouter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		target string
		action selector.Action
		stack  string
	}{
		{"db.vlink.alt:5432", selector.Stack, "zstd+tcp"},
		{"web.vlink.alt:80", selector.Stack, ""},
		{"bad.vlink.alt:80", selector.Refuse, ""},
		{"web.example:80", selector.Direct, ""},
	} {
		t.Run(tc.target, func(t *testing.T) {
			d, err := r.decide(tc.target)
			if err != nil || d.rule.Action != tc.action || d.rule.Via != "" && tc.action == selector.Stack || d.stack.String() != tc.stack && tc.stack != "" {
				t.Fatalf("decide = %+v (stack %q), %v; want %v with stack %q and no gateway", d.rule, d.stack, err, tc.action, tc.stack)
			}
		})
	}
	for _, name := range []string{"web.vlink.alt", "db.vlink.alt"} {
		if !r.nameRouted(name, 0) || !r.nameRouted(name, 80) {
			t.Errorf("%s would be resolved by the DNS", name)
		}
	}
	if r.nameRouted("web.example", 80) {
		t.Error("web.example is routed though the default is direct")
	}
}
