// Package tomlerr words the errors of go-toml's strict decoder for the
// user without quoting the file: config files hold stacks, and stacks
// passwords. go-toml's own words show the lines around an unknown key,
// and a syntax error quotes the character it stopped at.
package tomlerr

import (
	"errors"
	"fmt"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// An Error is a decoding error of the TOML file Path, in words that
// name lines and keys and quote nothing else of the file.
type Error struct {
	Path string
	Err  error // the decoder's error, whose words are not shown
	text string
}

func (e *Error) Error() string { return e.text }

func (e *Error) Unwrap() error { return e.Err }

// New returns err, a Decode error for the file at path, as an *Error;
// another error prefixed with path.
func New(path string, err error) error {
	var sm *toml.StrictMissingError // before DecodeError, which it holds
	if errors.As(err, &sm) {
		e := &Error{Path: path, Err: err}
		var b strings.Builder
		for i, de := range sm.Errors {
			row, _ := de.Position()
			if i > 0 {
				b.WriteString("; ")
			}
			fmt.Fprintf(&b, "%s:%d: unknown key %q", path, row, strings.Join(de.Key(), "."))
		}
		e.text = b.String()
		return e
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, col := de.Position()
		e := &Error{Path: path, Err: err}
		if key := de.Key(); len(key) > 0 {
			// A value of the wrong type: the words name types, or are a
			// TextUnmarshaler's, whose values are no secrets.
			e.text = fmt.Sprintf("%s:%d:%d: %s: %v", path, row, col, strings.Join(key, "."), de)
		} else {
			e.text = fmt.Sprintf("%s:%d:%d: not valid TOML (the parser's words are left out: they may quote a character of a secret)", path, row, col)
		}
		return e
	}
	return fmt.Errorf("%s: %w", path, err)
}
