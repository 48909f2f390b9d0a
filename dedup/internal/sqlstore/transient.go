package sqlstore

import "strings"

// PostgresTransient reports whether a PostgreSQL SQLSTATE names a condition
// of the database, not of the statement's data: a serialization failure or a
// deadlock (40001, 40P01), a lost or refused connection (class 08), a
// session the server terminated for idling in a transaction (25P03,
// idle_in_transaction_session_timeout), or a server that is shutting down
// or starting (57P01-57P03): a connection the server terminated is
// infrastructure wherever it surfaces. Lock timeouts
// (55P03), exhausted resources (class 53) and every other code are the
// failing statement's own: a handler that sets lock_timeout, or writes more
// than the disk holds, gets a counted attempt.
func PostgresTransient(code string) bool {
	switch code {
	case "40001", "40P01", "25P03", "57P01", "57P02", "57P03":
		return true
	}
	return strings.HasPrefix(code, "08")
}

// PostgresAborted reports whether a PostgreSQL SQLSTATE says only that the
// transaction had already failed (25P02, in_failed_sql_transaction): the
// statement that got it is not what failed.
func PostgresAborted(code string) bool { return code == "25P02" }
