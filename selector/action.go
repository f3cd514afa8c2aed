package selector

import (
	"fmt"
	"strconv"
)

// An Action says what a dial to a matching destination does.
type Action uint8

const (
	// Auto is the zero Action: Stack if the rule names a stack or a
	// gateway, Direct otherwise. [Selector.Match] never returns it.
	Auto Action = iota
	// Direct dials plain TCP: no layers and no hello, byte for byte what
	// net.Dial does.
	Direct
	// Stack dials through the rule's stack, or through its Via gateway.
	Stack
	// Refuse fails the dial without touching the network.
	Refuse
	// BestEffort races the rule's Try list, best first, and takes the
	// first that connects (the caller's best-effort selector).
	BestEffort
)

var actionNames = [...]string{Auto: "auto", Direct: "direct", Stack: "stack", Refuse: "refuse", BestEffort: "best-effort"}

func (a Action) valid() bool { return int(a) < len(actionNames) }

// String returns the text form: "auto", "direct", "stack", "refuse" or
// "best-effort".
func (a Action) String() string {
	if a.valid() {
		return actionNames[a]
	}
	return "Action(" + strconv.Itoa(int(a)) + ")"
}

// MarshalText implements encoding.TextMarshaler.
func (a Action) MarshalText() ([]byte, error) {
	if !a.valid() {
		return nil, fmt.Errorf("%w: unknown action %d", ErrBadRule, uint8(a))
	}
	return []byte(actionNames[a]), nil
}

// UnmarshalText implements encoding.TextUnmarshaler, so config files can
// say action = "refuse". The empty text is [Auto].
func (a *Action) UnmarshalText(text []byte) error {
	if len(text) == 0 {
		*a = Auto
		return nil
	}
	for i, name := range actionNames {
		if string(text) == name {
			*a = Action(i)
			return nil
		}
	}
	return fmt.Errorf("%w: unknown action %q (want direct, stack, refuse or best-effort)", ErrBadRule, text)
}
