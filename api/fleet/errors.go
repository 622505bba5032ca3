package fleet

import (
	"errors"
	"strconv"
)

// FieldError is one problem in a spec: the field path (as written in YAML,
// e.g. "engines[3].region"), what is wrong with it (naming the bad value),
// and, when known, the input line. Parse joins all of them with errors.Join;
// use Errors to get them back.
type FieldError struct {
	// Path is the field path, "" for the document as a whole.
	Path string
	// Line is the 1-based input line, 0 when not known.
	Line int
	// Msg says what is wrong, naming the bad value.
	Msg string
}

// Error returns "path: msg", e.g. `engines[3].region: unknown region "eu-wst"`.
func (e *FieldError) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// WithLine returns "line N: path: msg" when the line is known, else Error().
func (e *FieldError) WithLine() string {
	if e.Line <= 0 {
		return e.Error()
	}
	return "line " + strconv.Itoa(e.Line) + ": " + e.Error()
}

// Errors returns the FieldErrors an error from Parse, Load or New carries,
// in input order, or nil if it carries none.
func Errors(err error) []*FieldError {
	var out []*FieldError
	var walk func(error)
	walk = func(err error) {
		if err == nil {
			return
		}
		if fe, ok := err.(*FieldError); ok {
			out = append(out, fe)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}

// Sentinel errors of the lookups. Returned errors wrap them with detail;
// test with errors.Is.
var (
	// ErrUnknownModel: the fleet serves no model of that name.
	ErrUnknownModel = errors.New("unknown model")
	// ErrNoClass: the model is served, but no eligibility class admits the
	// request (residency or context length).
	ErrNoClass = errors.New("no eligible class")
)
