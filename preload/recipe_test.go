package preload

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
)

func sampleRecipe() recipe {
	return recipe{gateway: netip.MustParseAddrPort("10.0.0.1:7000"), waitMs: 127000,
		opts: []recipeOpt{
			{level: 6, name: 13, kind: optBytes, val: []byte("reno")},
			{level: 1, name: 9, kind: optInt, val: []byte{0, 0, 0, 1}},
			{level: 6, name: 4, kind: optInt, val: []byte{0, 0, 0, 15}},
		},
		hello:  []byte("\x89VLK\r\n\x1a\n\x01\x01\x00\x05hello"),
		accept: []byte{1, 4, 0, 0}}
}

// TestRecipeLimits: a recipe past the shim's limits is not sent.
func TestRecipeLimits(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(r *recipe)
		ok   bool
	}{
		{"as it is", func(*recipe) {}, true},
		{"no hello", func(r *recipe) { r.hello = nil }, false},
		{"hello too long", func(r *recipe) { r.hello = make([]byte, maxRecipeHello+1) }, false},
		{"no accept", func(r *recipe) { r.accept = nil }, false},
		{"direct: neither", func(r *recipe) { r.hello, r.accept, r.waitMs = nil, nil, 0 }, true},
		{"accept too long", func(r *recipe) { r.accept = make([]byte, maxRecipeAccept+1) }, false},
		{"too many options", func(r *recipe) { r.opts = make([]recipeOpt, maxRecipeOpts+1) }, false},
		{"an int of 3 bytes", func(r *recipe) { r.opts[1].val = []byte{0, 0, 1} }, false},
		{"a name too long", func(r *recipe) { r.opts[0].val = make([]byte, maxOptValue+1) }, false},
		{"the longest", func(r *recipe) {
			r.gateway = netip.MustParseAddrPort("[fd00::1]:7000")
			r.hello, r.accept = make([]byte, maxRecipeHello), make([]byte, maxRecipeAccept)
			r.opts = make([]recipeOpt, maxRecipeOpts)
			for i := range r.opts {
				r.opts[i] = recipeOpt{level: 6, name: 13, kind: optBytes, val: make([]byte, maxOptValue)}
			}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := sampleRecipe()
			tc.edit(&r)
			body, ok := r.append(nil)
			if ok != tc.ok {
				t.Fatalf("append: %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			if len(body) > maxBody {
				t.Errorf("a recipe of %d bytes, over a frame's %d", len(body), maxBody)
			}
			got, err := parseRecipe(body)
			if err != nil {
				t.Fatalf("parseRecipe: %v", err)
			}
			if got.direct() != r.direct() {
				t.Errorf("parsed as direct: %v, want %v", got.direct(), r.direct())
			}
		})
	}
}

// FuzzRecipe: the shim's decoder of a recipe (parseRecipe has its
// checks) never panics, and what it takes encodes back to the same bytes.
func FuzzRecipe(f *testing.F) {
	r := sampleRecipe()
	body, _ := r.append(nil)
	f.Add(body)
	f.Add(body[:len(body)-1])
	r.hello, r.accept = nil, nil
	direct, _ := r.append(nil)
	f.Add(direct)
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseRecipe(b)
		if err != nil {
			if !errors.Is(err, ErrBadFrame) {
				t.Fatalf("error %v does not match ErrBadFrame", err)
			}
			return
		}
		got, ok := r.append(nil)
		if !ok || !bytes.Equal(got, b) {
			t.Fatalf("re-encoded %x (%v), read %x", got, ok, b)
		}
	})
}
