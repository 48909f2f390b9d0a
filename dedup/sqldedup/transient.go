package sqldedup

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"slices"
	"strings"

	"github.com/idemq/idemq/dedup/internal/sqlstore"
)

// SQLite result codes (the primary code, the low byte of an extended code)
// that say the database was busy, not that the statement was wrong.
const (
	sqliteBusy   = 5 // SQLITE_BUSY: another connection holds the lock
	sqliteLocked = 6 // SQLITE_LOCKED: a conflict inside one connection
)

// IsTransient implements dedupdriver.Tx. It reports whether err, returned
// inside one of the store's transactions, is a passing database condition
// that says nothing about the message, so that a runner retries it without
// counting it against the message's attempts: SQLite's SQLITE_BUSY and
// SQLITE_LOCKED (and their extended codes) from drivers whose error has a
// Code() int method, as modernc.org/sqlite's; a PostgreSQL SQLSTATE that
// sqlstore.PostgresTransient names, from drivers whose error has a
// SQLState() string method, as pgx's and lib/pq's; and driver.ErrBadConn
// and sql.ErrConnDone. Anything else, a context deadline included, is the
// message's own failure. It is safe for concurrent use.
func (s txDriver) IsTransient(err error) bool {
	if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) {
		return true
	}
	var state interface{ SQLState() string }
	if errors.As(err, &state) {
		return sqlstore.PostgresTransient(state.SQLState())
	}
	var coded interface{ Code() int }
	if s.cfg.Dialect == SQLite && errors.As(err, &coded) {
		switch coded.Code() & 0xff {
		case sqliteBusy, sqliteLocked:
			return true
		}
	}
	return false
}

// sqliteConstraint is SQLITE_CONSTRAINT, the primary code of a constraint
// that failed (at commit: a deferred foreign key).
const sqliteConstraint = 19

// failedTxCommit holds the messages with which PostgreSQL drivers for
// database/sql report the commit of a transaction that had failed: pgx's
// stdlib driver (pgx.ErrTxCommitRollback) and lib/pq (ErrInFailedTransaction).
// They carry no SQLSTATE, so they are matched by text.
var failedTxCommit = []string{
	"commit unexpectedly resulted in rollback",
	"could not complete operation in a failed transaction",
}

// IsAborted implements dedupdriver.Tx: PostgreSQL's SQLSTATE 25P02,
// the error of any statement sent after an earlier one failed in the same
// transaction, from drivers whose error has a SQLState() string method.
// SQLite rolls back only the failed statement, so it has no such state.
func (s txDriver) IsAborted(err error) bool {
	var state interface{ SQLState() string }
	return errors.As(err, &state) && sqlstore.PostgresAborted(state.SQLState())
}

// refused reports whether a commit error says the database refused the
// transaction's content (see Commit).
func (s *Store) refused(err error) bool {
	if (txDriver{Store: s}).IsTransient(err) {
		return false
	}
	var state interface{ SQLState() string }
	if errors.As(err, &state) {
		return true
	}
	var coded interface{ Code() int }
	if s.cfg.Dialect == SQLite && errors.As(err, &coded) {
		return coded.Code()&0xff == sqliteConstraint
	}
	msg := strings.ToLower(err.Error())
	return slices.ContainsFunc(failedTxCommit, func(m string) bool { return strings.Contains(msg, m) })
}
