package idemq

import "errors"

// ErrInvalidConfig is matched by every configuration error of idemq, from
// package consumer and from every store, source and sink: a *ConfigError and
// every error that joins them. It is the only such sentinel; no package
// re-exports it.
var ErrInvalidConfig = errors.New("idemq: invalid configuration")

// ConfigError reports one invalid configuration field. It matches
// ErrInvalidConfig. Every package of idemq reports this one type.
//
// A constructor or Validate that finds several bad fields reports all of
// them in one error: it wraps one *ConfigError per field, in the order of
// the Config's fields, through Unwrap() []error as errors.Join does, and
// prints them on one line separated by "; ". errors.As finds the first;
// to see each, walk the Unwrap() []error of the returned error.
type ConfigError struct {
	// Field names the field as a Go selector. Fields of consumer.Config
	// are unqualified ("Name", "Retry.MaxAttempts"); the fields of other
	// packages' Configs carry the package and type ("pgdedup.Config.Table",
	// "kafkasource.Config.Brokers"), and a missing constructor argument is
	// named by its call ("pgdedup.New(db)").
	Field string
	// Reason says what is wrong with the value.
	Reason string
	// Err is the error that made the value unusable, if there is one (a
	// URL that does not parse, a client library's own check); Unwrap
	// returns it.
	Err error
}

// Error implements error.
func (e *ConfigError) Error() string {
	return "idemq: invalid configuration: " + e.detail()
}

// detail is the error without its "idemq: invalid configuration: " prefix.
func (e *ConfigError) detail() string {
	switch {
	case e.Err == nil:
		return e.Field + ": " + e.Reason
	case e.Reason == "":
		return e.Field + ": " + e.Err.Error()
	}
	return e.Field + ": " + e.Reason + ": " + e.Err.Error()
}

// Unwrap returns Err.
func (e *ConfigError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrInvalidConfig) true.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }
