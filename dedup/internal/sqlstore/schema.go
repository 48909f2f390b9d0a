package sqlstore

import (
	"context"
	"errors"
	"strings"

	"github.com/idemq/idemq/dedup"
)

// CheckSchema checks, with one statement that reads no row, that the
// record table and its failure table exist with every column of the latest
// migration. It returns a *dedup.SchemaError (matching dedup.ErrNotMigrated)
// that names the store's Migrate when they do not, and the database's error
// when it could not be asked.
func (s *Store) CheckSchema(ctx context.Context) error {
	rows, err := s.db.Query(ctx, schemaProbe(s.quoted, s.failures))
	if err == nil {
		rows.Next() // there is none: only an error ends the rows
		err = closeRows(rows, nil)
	}
	if undefined(err) {
		return &dedup.SchemaError{Table: s.display, Err: err,
			Migrate: "create it with " + s.name + ".Store.Migrate (or run `idemq migrate`, or dedup/migrate)"}
	}
	return s.wrap("check schema", err)
}

// schemaProbe returns the statement that checks that the record table t and
// the failure table failures (both quoted, and qualified where the database
// has schemas) exist with every column the latest migration gives them. It
// reads no row and returns none; it fails with the database's "undefined"
// error (see undefined) when the migrations were not applied. It is valid
// SQL for PostgreSQL and SQLite.
func schemaProbe(t, failures string) string {
	return `SELECT 1 FROM (SELECT scope, key, payload_hash, processed_at, expires_at, result FROM ` + t + ` WHERE 1 = 0) AS r, ` +
		`(SELECT scope, key, payload_hash, failures, expires_at FROM ` + failures + ` WHERE 1 = 0) AS f`
}

// undefined reports whether err says that a table, schema or column does not
// exist: PostgreSQL's SQLSTATE 42P01 (undefined_table), 3F000
// (invalid_schema_name) and 42703 (undefined_column), from drivers whose
// error has a SQLState() string method (pgx, lib/pq), and SQLite's "no such
// table" and "no such column", which carry no code of their own.
func undefined(err error) bool {
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
