package lab

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// ParseTopology decodes a topology file (TOML) and validates it. Unknown
// keys are errors, so a typo never silently leaves a link unshaped.
//
//	name = "wan"
//	[sysctls]
//	"net.ipv4.tcp_rmem" = "4096 131072 67108864"
//
//	[[host]]
//	name = "client"
//
//	[[host]]
//	name = "server"
//	firewall = { open = ["tcp/5201"] }
//
//	[[link]]
//	a = "client"
//	b = "server"
//	rate = "1gbit"
//	rtt = "50ms"
//	jitter = "1ms"
//	loss = "0.1%"
func ParseTopology(data []byte) (Topology, error) {
	var t Topology
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		var sm *toml.StrictMissingError
		if errors.As(err, &sm) && len(sm.Errors) > 0 {
			e := sm.Errors[0]
			row, col := e.Position()
			return Topology{}, fmt.Errorf("%w: line %d, column %d: unknown key %q", ErrTopology, row, col, strings.Join(e.Key(), "."))
		}
		var de *toml.DecodeError
		if errors.As(err, &de) {
			row, col := de.Position()
			return Topology{}, fmt.Errorf("%w: line %d, column %d: %s", ErrTopology, row, col, de.Error())
		}
		return Topology{}, fmt.Errorf("%w: %w", ErrTopology, err)
	}
	if err := checkDurations(data); err != nil {
		return Topology{}, err
	}
	if err := t.Validate(); err != nil {
		return Topology{}, err
	}
	return t, nil
}

// checkDurations rejects durations written as bare numbers: TOML would
// decode rtt = 50 as 50 nanoseconds, which nobody means. (Rates, sizes
// and losses mean the same as numbers and as text: bit/s, bytes, a
// fraction.)
func checkDurations(data []byte) error {
	var doc struct {
		Link []map[string]any `toml:"link"`
	}
	if toml.Unmarshal(data, &doc) != nil {
		return nil // the typed decode succeeded; nothing more to say
	}
	check := func(where string, m map[string]any, keys ...string) error {
		for _, k := range keys {
			if v, ok := m[k]; ok {
				if _, isString := v.(string); !isString {
					return fmt.Errorf("%w: %s: %s = %v: write a duration as a string with a unit, like \"50ms\"", ErrTopology, where, k, v)
				}
			}
		}
		return nil
	}
	for i, l := range doc.Link {
		where := fmt.Sprintf("link %d", i+1)
		if err := check(where, l, "rtt", "jitter"); err != nil {
			return err
		}
		for _, dir := range []string{"a_to_b", "b_to_a"} {
			if m, ok := l[dir].(map[string]any); ok {
				if err := check(where+" "+dir, m, "delay", "jitter"); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// LoadTopology reads and parses a topology file.
func LoadTopology(path string) (Topology, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Topology{}, err
	}
	t, err := ParseTopology(data)
	if err != nil {
		return Topology{}, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}
