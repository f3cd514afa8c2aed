// Package nodename holds the rule for a vlink node's name, so that package
// vlink (vlink.ValidNodeName) and the packages that must not import the
// network stack (vlink/nodecert) check one rule.
package nodename

// MaxLen bounds a node name: one DNS label, so NAME.vlink.alt is a valid
// host name.
const MaxLen = 63

// Valid reports whether name can name a node: 1 to MaxLen bytes of
// lower-case ASCII letters, digits and '-', starting with a letter and not
// ending with '-' (a DNS label).
func Valid(name string) bool {
	if len(name) == 0 || len(name) > MaxLen {
		return false
	}
	if c := name[0]; c < 'a' || c > 'z' {
		return false
	}
	if name[len(name)-1] == '-' {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}
