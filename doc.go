// Package idemq holds the types that every layer of idemq shares, and
// nothing else: it imports no other package of the module, so that consumer,
// dedup, the stores, the sources and the sinks can all report through it
// without importing each other (the role rivertype plays in river).
//
// Today that is the configuration error: every constructor and Validate of
// idemq reports an invalid field as a *ConfigError, and every configuration
// error matches ErrInvalidConfig:
//
//	if errors.Is(err, idemq.ErrInvalidConfig) { ... }
//	var ce *idemq.ConfigError
//	if errors.As(err, &ce) { log(ce.Field, ce.Reason) }
//
// The framework itself is package consumer; see its documentation.
package idemq
