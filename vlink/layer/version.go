package layer

import (
	"fmt"
	"strconv"
)

// VersionParam names the parameter that carries a layer's wire version:
// "mux:version=2" in a stack, and so in the hello that asks a listener to
// mirror the layer. It is how a layer changes its bytes on the wire
// without breaking the peers that run an older or a newer build. The rule:
//
//   - Give a format a new version whenever a peer of the old one would
//     misread it. Declare the versions the layer speaks with [Version],
//     and build the one [Args.Version] returns.
//   - A hello that names no version asks for [BaseVersion] (1), whatever
//     the build: every layer's first format, and the one spoken by peers
//     from before the parameter existed. Package vlink writes the version
//     into the hello whenever it is not 1, so the absence never changes
//     meaning.
//   - A listener speaks every version from the parameter's Min to its Max
//     and mirrors the one the hello asks for. It refuses any other with
//     vlink.CodeVersion, before a byte of the layer crosses, and the
//     reason names both versions and the side to upgrade: the one whose
//     version is older. A layer without the parameter speaks version 1
//     only, so this build refuses just as precisely the hello of a later
//     build that gives such a layer a version 2.
//   - A dialer speaks the parameter's Default unless its stack names a
//     version. It does not try another version when refused: the refusal
//     is the error its Dial returns (a *vlink.RefusedError, Code
//     vlink.CodeVersion, matching vlink.ErrRefused), and the operator
//     upgrades the side it names, or writes the older version in the
//     stack until then.
//   - So an upgrade rolls, listeners first: a release adds a version to
//     Max and leaves Default alone, so its dialers still speak what every
//     listener of the release before understands; the next release may
//     raise Default; a version leaves Min only once no dialer speaks it.
const VersionParam = "version"

// BaseVersion is the wire version a hello without [VersionParam] asks for.
const BaseVersion = 1

// Version returns the schema entry of a layer's wire version, for
// [Spec.Params]: the layer speaks every version from oldest to newest, and
// its dialers speak the version speak unless their stack names another
// (see [VersionParam] for the rule).
func Version(oldest, newest, speak int) Param {
	return Param{
		Name: VersionParam, Type: TypeInt, Default: strconv.Itoa(speak), Min: int64(oldest), Max: int64(newest),
		Doc: "wire format version; a listener refuses one it does not speak",
	}
}

// A VersionError reports a wire version that a layer does not speak.
type VersionError struct {
	Layer          string
	Version        int64 // the version asked for
	Named          bool  // whether the version was named (else it is BaseVersion)
	Oldest, Newest int64 // the versions spoken here
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("%v: %s wire version %d is not spoken by this build (%s)", ErrBadParam, e.Layer, e.Version, e.Spoken())
}

// Is makes a VersionError match ErrBadParam: a stack that names a version
// this build does not speak has a bad parameter.
func (e *VersionError) Is(target error) bool { return target == ErrBadParam }

// Older reports whether the version asked for is older than every version
// spoken here: the side that asked for it is the one to upgrade.
func (e *VersionError) Older() bool { return e.Version < e.Oldest }

// Spoken says which versions are spoken here: "version 2", "versions 2 to 3".
func (e *VersionError) Spoken() string {
	if e.Oldest == e.Newest {
		return fmt.Sprintf("version %d", e.Oldest)
	}
	return fmt.Sprintf("versions %d to %d", e.Oldest, e.Newest)
}

// versions returns the wire versions s speaks: its VersionParam's bounds,
// or BaseVersion alone for a layer without one.
func (s *Spec) versions() (oldest, newest int64, versioned bool) {
	if p := s.param(VersionParam); p != nil {
		return p.Min, p.Max, true
	}
	return BaseVersion, BaseVersion, false
}

// Version returns the wire version to build: the one the parameters name,
// or the schema's default. It returns a *VersionError for a version the
// layer does not speak, which a layer's New returns: a stack built without
// Parse can name one.
func (a Args) Version() (int, error) {
	oldest, newest, versioned := a.spec.versions()
	if !versioned {
		return BaseVersion, nil
	}
	n := a.num(VersionParam)
	if n < oldest || n > newest {
		return 0, &VersionError{Layer: a.spec.Name, Version: n, Named: a.Has(VersionParam), Oldest: oldest, Newest: newest}
	}
	return int(n), nil
}
