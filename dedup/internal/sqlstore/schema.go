package sqlstore

import (
	"errors"
	"strings"
)

// SchemaProbe returns the statement that checks that the record table t and
// the failure table failures (both quoted, and qualified where the database
// has schemas) exist with every column the latest migration gives them. It
// reads no row and returns none; it fails with the database's "undefined"
// error (see Undefined) when the migrations were not applied. It is valid
// SQL for PostgreSQL and SQLite.
func SchemaProbe(t, failures string) string {
	return `SELECT 1 FROM (SELECT scope, key, payload_hash, processed_at, expires_at, result FROM ` + t + ` WHERE 1 = 0) AS r, ` +
		`(SELECT scope, key, payload_hash, failures, expires_at FROM ` + failures + ` WHERE 1 = 0) AS f`
}

// Undefined reports whether err says that a table, schema or column does not
// exist: PostgreSQL's SQLSTATE 42P01 (undefined_table), 3F000
// (invalid_schema_name) and 42703 (undefined_column), from drivers whose
// error has a SQLState() string method (pgx, lib/pq), and SQLite's "no such
// table" and "no such column", which carry no code of their own.
func Undefined(err error) bool {
	if err == nil {
		return false
	}
	var state interface{ SQLState() string }
	if errors.As(err, &state) {
		switch state.SQLState() {
		case "42P01", "3F000", "42703":
			return true
		}
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "no such table") || strings.Contains(msg, "no such column")
}
