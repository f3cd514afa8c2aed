package nodecert

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

func TestNewRules(t *testing.T) {
	for _, tc := range []struct {
		name string
		rule Rule
		ok   bool
	}{
		{"name to name", Rule{"alice", "db", "5432"}, true},
		{"group to any", Rule{"group:ops", "*", "*"}, true},
		{"range", Rule{"*", "group:web", "8000-8080"}, true},
		{"one-port range", Rule{"*", "*", "22-22"}, true},
		{"full range", Rule{"*", "*", "1-65535"}, true},
		{"no ports", Rule{"*", "*", ""}, false},
		{"no from", Rule{"", "*", "*"}, false},
		{"no to", Rule{"*", "", "*"}, false},
		{"bad name", Rule{"Alice", "*", "*"}, false},
		{"empty group", Rule{"group:", "*", "*"}, false},
		{"bad group", Rule{"*", "group:Ops", "*"}, false},
		{"other prefix", Rule{"*", "tag:ops", "*"}, false},
		{"port 0", Rule{"*", "*", "0"}, false},
		{"port too big", Rule{"*", "*", "65536"}, false},
		{"leading zero", Rule{"*", "*", "022"}, false},
		{"sign", Rule{"*", "*", "+22"}, false},
		{"space", Rule{"*", "*", " 22"}, false},
		{"list", Rule{"*", "*", "22,80"}, false},
		{"reversed range", Rule{"*", "*", "80-22"}, false},
		{"open range", Rule{"*", "*", "80-"}, false},
		{"star range", Rule{"*", "*", "1-*"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewRules([]Rule{{"*", "*", "*"}, tc.rule})
			if tc.ok && err != nil {
				t.Fatal(err)
			}
			if !tc.ok && !errors.Is(err, ErrInvalidRule) {
				t.Fatalf("NewRules = %v, want ErrInvalidRule", err)
			}
		})
	}
}

func TestAllowed(t *testing.T) {
	owner := newOwner(t)
	cert := func(name string, groups ...string) *Certificate {
		return sign(t, owner, Template{Name: name, Groups: groups, PublicKey: nodeKey(t)})
	}
	alice, bob, db, web := cert("alice", "ops"), cert("bob", "dev"), cert("db", "data"), cert("web", "web", "data")
	rules, err := NewRules([]Rule{
		{From: "group:ops", To: "*", Ports: "*"},
		{From: "bob", To: "group:data", Ports: "5432"},
		{From: "*", To: "web", Ports: "8000-8080"},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		from, to *Certificate
		port     uint16
		want     bool
	}{
		{"group to any, any port", alice, db, 22, true},
		{"group to any, port 0", alice, web, 0, true},
		{"name to group", bob, db, 5432, true},
		{"name to group, other port", bob, db, 5433, false},
		{"any to name, low end", db, web, 8000, true},
		{"any to name, high end", db, web, 8080, true},
		{"any to name, past the range", db, web, 8081, false},
		{"nothing matches", db, alice, 22, false},
		{"not into the source's group", web, bob, 5432, false},
		{"no source", nil, web, 8000, false},
		{"no destination", alice, nil, 22, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := rules.Allowed(tc.from, tc.to, tc.port); got != tc.want {
				t.Fatalf("Allowed = %v, want %v", got, tc.want)
			}
		})
	}

	// Without rules, everything is allowed.
	empty, err := NewRules(nil)
	if err != nil {
		t.Fatal(err)
	}
	var none *Rules
	if !empty.Allowed(db, alice, 1) || !none.Allowed(db, alice, 1) || none.Len() != 0 || rules.Len() != 3 {
		t.Fatal("no rules must allow everything")
	}
}

// TestRulesTOML: a Rule is read from TOML as its field tags spell it.
func TestRulesTOML(t *testing.T) {
	var cfg struct {
		Allow []Rule `toml:"allow"`
	}
	const text = `
[[allow]]
from = "group:ops"
to = "db"
ports = "5432"
`
	if err := toml.NewDecoder(strings.NewReader(text)).DisallowUnknownFields().Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	if want := []Rule{{From: "group:ops", To: "db", Ports: "5432"}}; !slices.Equal(cfg.Allow, want) {
		t.Fatalf("decoded %+v, want %+v", cfg.Allow, want)
	}
	if _, err := NewRules(cfg.Allow); err != nil {
		t.Fatal(err)
	}
}
