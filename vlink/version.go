package vlink

import (
	"maps"
	"strconv"

	"github.com/vlink-dev/vlink/vlink/layer"
)

// Wire versions of layers (layer.VersionParam has the rule): a hello that
// names none asks for layer.BaseVersion, so the dialer names the version
// whenever it is another, and the listener refuses a version its layer
// does not speak before a byte of the layer crosses.

// wireVersions returns the wire versions spec speaks, and the one its
// dialers speak unless told otherwise.
func wireVersions(spec *layer.Spec) (oldest, newest int64, speak string) {
	if p, ok := spec.Param(layer.VersionParam); ok {
		return p.Min, p.Max, p.Default
	}
	return layer.BaseVersion, layer.BaseVersion, strconv.Itoa(layer.BaseVersion)
}

// checkVersion refuses the i-th layer of a hello (0-based) if it asks
// for a wire version this listener's layer does not speak. A version that
// is not an integer is left to the schema's check.
func checkVersion(i int, l Layer, spec *layer.Spec) *RefusedError {
	oldest, newest, _ := wireVersions(spec)
	v, named := l.Params[layer.VersionParam]
	n := int64(layer.BaseVersion)
	if named {
		var err error
		if n, err = strconv.ParseInt(v, 10, 64); err != nil {
			return nil
		}
	}
	if oldest <= n && n <= newest {
		return nil
	}
	e := &layer.VersionError{Layer: l.Name, Version: n, Named: named, Oldest: oldest, Newest: newest}
	asked := ""
	if !named {
		asked = " (its hello names none)"
	}
	older := "listener"
	if e.Older() {
		older = "dialer"
	}
	return refuse(CodeVersion, "layer %d (%s): the dialer speaks wire version %d%s, this listener %s: upgrade the %s",
		i+1, l.Name, n, asked, e.Spoken(), older)
}

// helloLayer returns l as the dialer's hello carries it (dialer set), or
// as the listener builds it from the hello: a hello names the wire
// version only when it is not layer.BaseVersion. The dialer speaks the
// version its stack names, else its schema's default; the listener, the
// version the hello names, else BaseVersion, whatever its own default.
// l itself comes back when nothing changes, as for every layer today.
func helloLayer(l Layer, dialer bool) Layer {
	spec := lookup(l.Name)
	if spec == nil {
		return l
	}
	_, _, speak := wireVersions(spec)
	_, versioned := spec.Param(layer.VersionParam)
	v, named := l.Params[layer.VersionParam]
	n, err := strconv.ParseInt(v, 10, 64)
	var set string // the value to set, "" to drop the parameter
	switch {
	case named && err == nil && n == layer.BaseVersion && (dialer || !versioned):
		// The base version goes unnamed: a listener from before the
		// layer had versions refuses the parameter.
	case !named && speak != strconv.Itoa(layer.BaseVersion):
		set = strconv.Itoa(layer.BaseVersion)
		if dialer {
			set = speak
		}
	default:
		return l
	}
	params := maps.Clone(l.Params)
	delete(params, layer.VersionParam)
	if set != "" {
		if params == nil {
			params = map[string]string{}
		}
		params[layer.VersionParam] = set
	}
	return Layer{Name: l.Name, Params: params}
}

// helloStack is the text of a hello's stack field for the dialer's layers.
func helloStack(layers []Layer) string {
	hello := make([]Layer, len(layers))
	for i, l := range layers {
		hello[i] = helloLayer(l, true)
	}
	return Stack{Layers: hello}.String()
}
