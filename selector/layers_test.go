package selector

import "github.com/vlink-dev/vlink/vlink/layer"

// A rule's text form shows what of its stacks the layers' schemas say is
// no secret (secret.RedactStack). The tests' stacks name ssh, whose
// package is not linked here: a stand-in gives its schema.
func init() {
	layer.Register(layer.Spec{
		Name: "ssh", Kind: layer.KindFactory, Terminal: true, Summary: "stand-in for the tests",
		Params: []layer.Param{{Name: "host", Type: layer.TypeString}},
		New:    func(layer.Args) (any, error) { return nil, nil },
	})
}
