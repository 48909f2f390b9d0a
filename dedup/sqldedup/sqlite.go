package sqldedup

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/idemq/idemq"
)

// SQLiteDriver is the database/sql driver name that OpenSQLite uses: the one
// modernc.org/sqlite (pure Go, no cgo) registers. Import the driver for its
// side effect:
//
//	import _ "modernc.org/sqlite"
const SQLiteDriver = "sqlite"

// DefaultSQLiteBusyTimeout is how long a SQLite connection opened by
// OpenSQLite waits for the write lock held by another connection or process
// before failing with SQLITE_BUSY.
const DefaultSQLiteBusyTimeout = 10 * time.Second

// SQLiteDSN returns the modernc.org/sqlite data source name that OpenSQLite
// opens for the database file at path:
//
//   - _txlock=immediate: every transaction begins with BEGIN IMMEDIATE, so
//     it takes SQLite's single write lock before its first statement and can
//     never fail halfway when upgrading a read lock;
//   - busy_timeout: a transaction waits up to DefaultSQLiteBusyTimeout for
//     the write lock that another process holds, instead of failing at once;
//   - journal_mode=WAL: readers (dashboards, `idemq inspect`) never block
//     the writer and the writer never blocks them;
//   - synchronous=FULL: a commit is on disk before it returns, so a message
//     is never acknowledged for an effect that a power loss could undo;
//   - foreign_keys=on, as business schemas expect.
func SQLiteDSN(path string) string {
	q := url.Values{}
	q.Set("_txlock", "immediate")
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", DefaultSQLiteBusyTimeout.Milliseconds()))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_pragma", "foreign_keys(ON)")
	return "file:" + path + "?" + q.Encode()
}

// OpenSQLite opens the SQLite database file at path (creating it if needed)
// with SQLiteDSN, limits the pool to one connection, and checks that the
// database answers.
//
// One connection is SQLite's own model: there is one writer at a time, so
// the runner's transactions queue for the connection in database/sql
// (first come, first served, honouring their contexts) instead of polling
// for the file lock. Across processes, BEGIN IMMEDIATE and the busy timeout
// serialise writers. A handler must use the *sql.Tx it is given, never the
// *sql.DB: with one connection, a query on the *sql.DB inside a handler
// waits for the handler's own transaction until the handler times out.
//
// The modernc.org/sqlite driver must be registered (a blank import);
// otherwise OpenSQLite returns database/sql's "unknown driver" error.
func OpenSQLite(ctx context.Context, path string) (*sql.DB, error) {
	if path == "" || strings.ContainsAny(path, "?#") {
		return nil, &idemq.ConfigError{Field: "sqldedup.OpenSQLite(path)", Reason: fmt.Sprintf("%q is empty or contains '?' or '#'", path)}
	}
	db, err := sql.Open(SQLiteDriver, SQLiteDSN(path))
	if err != nil {
		return nil, fmt.Errorf("sqldedup: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxIdleTime(0)
	db.SetConnMaxLifetime(0)
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("sqldedup: open %s: %w", path, err)
	}
	return db, nil
}
