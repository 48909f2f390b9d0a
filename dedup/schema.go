package dedup

import (
	"context"
	"errors"
	"fmt"
)

// ErrNotMigrated is matched by the error of a CheckSchema method when
// the database lacks a table or column that the checker needs: its
// migrations were not applied. The concrete error is a *SchemaError.
var ErrNotMigrated = errors.New("dedup: database schema not migrated")

// SchemaError reports a table that does not exist, or lacks a column, in
// the database a store (or a sink) writes to. It matches ErrNotMigrated and
// unwraps to the database's own error.
type SchemaError struct {
	// Table is the table, schema-qualified where the database has schemas.
	Table string
	// Migrate says how to create it, like "call pgdedup.Store.Migrate or
	// run idemq migrate".
	Migrate string
	// Err is the database's error (PostgreSQL's 42P01 undefined_table,
	// SQLite's "no such table", ...).
	Err error
}

// Error implements error.
func (e *SchemaError) Error() string {
	return fmt.Sprintf("dedup: table %s is missing or out of date (%v): %s", e.Table, e.Err, e.Migrate)
}

// Unwrap returns Err.
func (e *SchemaError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrNotMigrated) true.
func (e *SchemaError) Is(target error) bool { return target == ErrNotMigrated }

// SchemaChecker is implemented by a consumer.Hook that writes to tables of
// its own (and by the stores' drivers, see dedupdriver.Common). CheckSchema reports whether the tables
// and columns it uses exist, without reading or writing any row: a
// *SchemaError (matching ErrNotMigrated) when they do not, another error
// when the database could not be asked (it is down). The Runner calls it
// once when Run starts and refuses to start on ErrNotMigrated, so that a
// worker whose migrations were not applied fails at once with the remedy
// instead of retrying every message.
type SchemaChecker interface {
	CheckSchema(ctx context.Context) error
}
