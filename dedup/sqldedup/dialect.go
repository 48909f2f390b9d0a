package sqldedup

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/internal/sqlstore"
	"github.com/idemq/idemq/dedup/migrate"
)

// Dialect names the SQL dialect of the database behind a Store. It is
// dedup/migrate's Dialect.
type Dialect = migrate.Dialect

// The supported dialects.
const (
	// SQLite is SQLite 3.37 or newer, for example through modernc.org/sqlite
	// (pure Go, driver name "sqlite"). SQLite has one writer at a time: see
	// the package documentation and OpenSQLite.
	SQLite = migrate.SQLite
	// Postgres is PostgreSQL 12 or newer, for example through
	// github.com/jackc/pgx/v5/stdlib (driver name "pgx"). The table is the
	// one dedup/pgdedup uses, so both stores can share it.
	Postgres = migrate.Postgres
)

// maxKeysPerStatement bounds the keys sent in one statement, well below the
// parameter limits of SQLite (32766) and PostgreSQL (65535).
const maxKeysPerStatement = 500

// queries renders the store's SQL for its dialect and table. Times cross
// the driver as Unix microseconds (int64) in both dialects, so scanning is
// the same for every driver.
type queries struct{ *sqlstore.Store }

// insertClaims inserts recs (sorted by key) and returns the keys it inserted.
// Rows are inserted in list order, so concurrent claims lock keys in the same
// order. A conflicting uncommitted row makes PostgreSQL wait for its
// transaction, then skip the row if it committed.
func (q queries) insertClaims(scope string, recs []dedup.Record, now time.Time, retention time.Duration) (string, []any) {
	args := make([]any, 1, 3+2*len(recs))
	args[0] = scope
	cols, row := "(scope, key, payload_hash, expires_at)", "($1, %s, %s, now() + $2::bigint * interval '1 microsecond')"
	if q.Postgres() {
		args = append(args, retention.Microseconds())
	} else {
		us := now.UnixMicro()
		args = append(args, us, us+retention.Microseconds())
		cols, row = "(scope, key, payload_hash, processed_at, expires_at)", "(?1, %s, %s, ?2, ?3)"
	}
	var b strings.Builder
	b.WriteString("INSERT INTO " + q.Table() + " " + cols + " VALUES ")
	for i, r := range recs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, row, q.Ph(len(args)+1), q.Ph(len(args)+2))
		args = append(args, r.Key, r.PayloadHash[:])
	}
	b.WriteString(" ON CONFLICT (scope, key) DO NOTHING RETURNING key")
	return b.String(), args
}

// selectClaims returns key, payload_hash, processed_at (µs), whether the
// record expired and its result, for the keys of recs, locking the rows
// (PostgreSQL) in key order. It is a new statement, so it sees the commits
// insertClaims waited for.
func (q queries) selectClaims(scope string, recs []dedup.Record, now time.Time) (string, []any) {
	var b strings.Builder
	args := make([]any, 0, 2+len(recs))
	args = append(args, scope)
	expired := "expires_at <= now()"
	if !q.Postgres() {
		args = append(args, now.UnixMicro())
		expired = "expires_at <= ?2"
	}
	b.WriteString("SELECT key, payload_hash, " + q.Micros("processed_at") + ", " + expired + ", result" +
		" FROM " + q.Table() + " WHERE scope = " + q.Ph(1) + " AND key IN (")
	for i, r := range recs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(q.Ph(len(args) + 1))
		args = append(args, r.Key)
	}
	b.WriteString(") ORDER BY key")
	if q.Postgres() {
		b.WriteString(" FOR UPDATE")
	}
	return b.String(), args
}

// renew overwrites an expired record, which then counts as a new claim.
func (q queries) renew(scope, key string, hash dedup.Hash, now time.Time, retention time.Duration) (string, []any) {
	if q.Postgres() {
		return "UPDATE " + q.Table() + " SET payload_hash = $3, processed_at = now(), " +
				"expires_at = now() + $4::bigint * interval '1 microsecond', result = NULL WHERE scope = $1 AND key = $2",
			[]any{scope, key, hash[:], retention.Microseconds()}
	}
	us := now.UnixMicro()
	return "UPDATE " + q.Table() + " SET payload_hash = ?3, processed_at = ?4, expires_at = ?5, result = NULL WHERE scope = ?1 AND key = ?2",
		[]any{scope, key, hash[:], us, us + retention.Microseconds()}
}

// deleteKey removes one record (Unclaim and Purge).
func (q queries) deleteKey() string {
	return "DELETE FROM " + q.Table() + " WHERE scope = " + q.Ph(1) + " AND key = " + q.Ph(2)
}

// inspect returns payload_hash, processed_at and expires_at (µs) and the
// result of a record.
func (q queries) inspect() string {
	return "SELECT payload_hash, " + q.Micros("processed_at") + ", " + q.Micros("expires_at") + ", result" +
		" FROM " + q.Table() + " WHERE scope = " + q.Ph(1) + " AND key = " + q.Ph(2)
}

// storeResult writes the result of one record.
func (q queries) storeResult() string {
	return "UPDATE " + q.Table() + " SET result = " + q.Ph(3) + " WHERE scope = " + q.Ph(1) + " AND key = " + q.Ph(2)
}

func (s *Store) claim(ctx context.Context, tx *sql.Tx, scope string, recs []dedup.Record) ([]dedup.Claim, error) {
	cs, err := sqlstore.Claim(ctx, sqlClaim{s: s, tx: tx, scope: scope}, recs, maxKeysPerStatement)
	if err != nil {
		return nil, fmt.Errorf("sqldedup: %w", err)
	}
	return cs, nil
}

// sqlClaim runs the statements of one claim in tx.
type sqlClaim struct {
	s     *Store
	tx    *sql.Tx
	scope string
}

func (c sqlClaim) Insert(ctx context.Context, recs []dedup.Record) (map[string]bool, error) {
	query, args := c.s.q.insertClaims(c.scope, recs, time.Now(), c.s.cfg.Retention)
	rows, err := c.tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	inserted := make(map[string]bool, len(recs))
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		inserted[k] = true
	}
	return inserted, rows.Err()
}

func (c sqlClaim) Lookup(ctx context.Context, recs []dedup.Record) (map[string]sqlstore.Found, error) {
	query, args := c.s.q.selectClaims(c.scope, recs, time.Now())
	rows, err := c.tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	found := make(map[string]sqlstore.Found, len(recs))
	for rows.Next() {
		var (
			k  string
			h  []byte
			at int64
			f  sqlstore.Found
		)
		if err := rows.Scan(&k, &h, &at, &f.Expired, &f.Result); err != nil {
			return nil, err
		}
		if f.Hash, err = dedup.HashFromBytes(h); err != nil {
			return nil, err
		}
		f.At = time.UnixMicro(at)
		found[k] = f
	}
	return found, rows.Err()
}

func (c sqlClaim) Renew(ctx context.Context, r dedup.Record) error {
	query, args := c.s.q.renew(c.scope, r.Key, r.PayloadHash, time.Now(), c.s.cfg.Retention)
	_, err := c.tx.ExecContext(ctx, query, args...)
	return err
}
