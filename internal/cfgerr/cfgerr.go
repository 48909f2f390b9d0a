// Package cfgerr collects the *idemq.ConfigError of one configuration
// check, so that every package reports all its bad fields at once in the
// shape idemq.ConfigError documents.
package cfgerr

import (
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/idemq/idemq"
)

// List collects configuration errors. The zero value is ready to use.
type List struct {
	// Prefix qualifies every field added with Add or Addf, as in
	// "pgdedup.Config.".
	Prefix string
	errs   []error
}

// Add records that field is invalid for reason.
func (l *List) Add(field, reason string) {
	l.errs = append(l.errs, &idemq.ConfigError{Field: l.Prefix + field, Reason: reason})
}

// AddErr records that field is invalid for reason because of err (reason
// may be empty).
func (l *List) AddErr(field, reason string, err error) {
	l.errs = append(l.errs, &idemq.ConfigError{Field: l.Prefix + field, Reason: reason, Err: err})
}

// Addf is Add with a formatted reason.
func (l *List) Addf(field, format string, args ...any) {
	l.Add(field, fmt.Sprintf(format, args...))
}

// NotNegative records that field "must not be negative" when d is, and
// reports whether d is valid, for the checks that compare it next.
func (l *List) NotNegative(field string, d time.Duration) bool {
	if d < 0 {
		l.Add(field, "must not be negative")
	}
	return d >= 0
}

// Positive records that field "must be at least 1" when n is not, and
// reports whether n is valid, for the checks that compare it next.
func (l *List) Positive(field string, n int) bool {
	if n < 1 {
		l.Add(field, "must be at least 1")
	}
	return n >= 1
}

// Include adds the errors of a nested check; err may be nil, one error or
// one that wraps several (Unwrap() []error), which are flattened.
func (l *List) Include(err error) {
	if err == nil {
		return
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			l.Include(e)
		}
		return
	}
	l.errs = append(l.errs, err)
}

// Err returns nil when nothing was added, the one error when one was, and
// otherwise an error that wraps them all.
func (l *List) Err() error {
	switch len(l.errs) {
	case 0:
		return nil
	case 1:
		return l.errs[0]
	}
	return &joined{errs: append([]error(nil), l.errs...)}
}

// joined is several configuration errors printed on one line.
type joined struct{ errs []error }

func (j *joined) Error() string {
	var b strings.Builder
	prefix := idemq.ErrInvalidConfig.Error() + ": "
	b.WriteString(prefix)
	for i, e := range j.errs {
		if i > 0 {
			b.WriteString("; ")
		}
		if _, ok := e.(*idemq.ConfigError); ok {
			b.WriteString(strings.TrimPrefix(e.Error(), prefix))
		} else {
			b.WriteString(e.Error())
		}
	}
	return b.String()
}

func (j *joined) Unwrap() []error { return j.errs }

// Fields returns the Field of every *idemq.ConfigError in err's tree, in
// order: what a Config check reported, for tests.
func Fields(err error) []string {
	var out []string
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		if ce, ok := e.(*idemq.ConfigError); ok {
			out = append(out, ce.Field)
			return
		}
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}

// IsNil reports whether v is nil, or an interface holding a nil pointer, map,
// slice, channel or func: a store whose constructor failed and whose error
// was ignored (a typed nil) passes a "== nil" check on the interface.
func IsNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Func, reflect.Interface, reflect.UnsafePointer:
		return rv.IsNil()
	}
	return false
}
