package sqldedup

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemq/idemq/dedup"
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

// queries renders the store's SQL for one dialect and table. Times cross the
// driver as Unix microseconds (int64) in both dialects, so scanning is the
// same for every driver.
type queries struct {
	dialect Dialect
	table   string // quoted, schema-qualified for Postgres
}

func newQueries(d Dialect, schema, table string) queries {
	t := quoteIdent(table)
	if d == Postgres {
		t = quoteIdent(schema) + "." + t
	}
	return queries{dialect: d, table: t}
}

// quoteIdent quotes a name that was validated as a plain identifier.
func quoteIdent(s string) string { return `"` + s + `"` }

// ph returns the placeholder of parameter n (1-based).
func (q queries) ph(n int) string {
	if q.dialect == Postgres {
		return "$" + strconv.Itoa(n)
	}
	return "?" + strconv.Itoa(n)
}

// micros renders a time column as Unix microseconds.
func (q queries) micros(col string) string {
	if q.dialect == Postgres {
		return "(extract(epoch FROM " + col + ") * 1000000)::bigint"
	}
	return col
}

// insertClaims inserts recs (sorted by key) and returns the keys it inserted.
// Rows are inserted in list order, so concurrent claims lock keys in the same
// order. A conflicting uncommitted row makes PostgreSQL wait for its
// transaction, then skip the row if it committed.
func (q queries) insertClaims(scope string, recs []dedup.Record, now time.Time, retention time.Duration) (string, []any) {
	var b strings.Builder
	args := make([]any, 0, 3+2*len(recs))
	args = append(args, scope)
	switch q.dialect {
	case Postgres:
		args = append(args, retention.Microseconds())
		b.WriteString("INSERT INTO " + q.table + " (scope, key, payload_hash, expires_at) VALUES ")
		for i, r := range recs {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "($1, %s, %s, now() + $2::bigint * interval '1 microsecond')", q.ph(len(args)+1), q.ph(len(args)+2))
			args = append(args, r.Key, r.PayloadHash[:])
		}
	default:
		us := now.UnixMicro()
		args = append(args, us, us+retention.Microseconds())
		b.WriteString("INSERT INTO " + q.table + " (scope, key, payload_hash, processed_at, expires_at) VALUES ")
		for i, r := range recs {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "(?1, %s, %s, ?2, ?3)", q.ph(len(args)+1), q.ph(len(args)+2))
			args = append(args, r.Key, r.PayloadHash[:])
		}
	}
	b.WriteString(" ON CONFLICT (scope, key) DO NOTHING RETURNING key")
	return b.String(), args
}

// selectClaims returns key, payload_hash, processed_at (µs), whether the
// record expired and its result, for the given keys, locking the rows (PostgreSQL) in key
// order. It is a new statement, so it sees the commits insertClaims waited
// for.
func (q queries) selectClaims(scope string, keys []string, now time.Time) (string, []any) {
	var b strings.Builder
	args := make([]any, 0, 2+len(keys))
	args = append(args, scope)
	expired := "expires_at <= now()"
	if q.dialect != Postgres {
		args = append(args, now.UnixMicro())
		expired = "expires_at <= ?2"
	}
	b.WriteString("SELECT key, payload_hash, " + q.micros("processed_at") + ", " + expired + ", result" +
		" FROM " + q.table + " WHERE scope = " + q.ph(1) + " AND key IN (")
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(q.ph(len(args) + 1))
		args = append(args, k)
	}
	b.WriteString(") ORDER BY key")
	if q.dialect == Postgres {
		b.WriteString(" FOR UPDATE")
	}
	return b.String(), args
}

// renew overwrites an expired record, which then counts as a new claim.
func (q queries) renew(scope, key string, hash dedup.Hash, now time.Time, retention time.Duration) (string, []any) {
	if q.dialect == Postgres {
		return "UPDATE " + q.table + " SET payload_hash = $3, processed_at = now(), " +
				"expires_at = now() + $4::bigint * interval '1 microsecond', result = NULL WHERE scope = $1 AND key = $2",
			[]any{scope, key, hash[:], retention.Microseconds()}
	}
	us := now.UnixMicro()
	return "UPDATE " + q.table + " SET payload_hash = ?3, processed_at = ?4, expires_at = ?5, result = NULL WHERE scope = ?1 AND key = ?2",
		[]any{scope, key, hash[:], us, us + retention.Microseconds()}
}

// deleteKey removes one record (Unclaim and Purge).
func (q queries) deleteKey() string {
	return "DELETE FROM " + q.table + " WHERE scope = " + q.ph(1) + " AND key = " + q.ph(2)
}

// inspect returns payload_hash, processed_at and expires_at (µs) and the
// result of a record.
func (q queries) inspect() string {
	return "SELECT payload_hash, " + q.micros("processed_at") + ", " + q.micros("expires_at") + ", result" +
		" FROM " + q.table + " WHERE scope = " + q.ph(1) + " AND key = " + q.ph(2)
}

// cleanup deletes up to limit expired records, oldest first, skipping rows
// locked by a concurrent claim (PostgreSQL; SQLite has one writer at a time).
func (q queries) cleanup(limit int, now time.Time) (string, []any) {
	if q.dialect == Postgres {
		return "DELETE FROM " + q.table + " WHERE ctid = ANY(ARRAY(SELECT ctid FROM " + q.table +
			" WHERE expires_at <= now() LIMIT $1 FOR UPDATE SKIP LOCKED))", []any{limit}
	}
	return "DELETE FROM " + q.table + " WHERE (scope, key) IN (SELECT scope, key FROM " + q.table +
		" WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2)", []any{now.UnixMicro(), limit}
}

// storeResult writes the result of one record.
func (q queries) storeResult() string {
	return "UPDATE " + q.table + " SET result = " + q.ph(3) + " WHERE scope = " + q.ph(1) + " AND key = " + q.ph(2)
}
