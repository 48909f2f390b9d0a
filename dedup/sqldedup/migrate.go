package sqldedup

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"strings"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/internal/sqlstore"
)

//go:embed migrations/sqlite/*.sql
var sqliteMigrations embed.FS

// Migration is one numbered schema change: plain SQL with goose annotations,
// written for the default table name; Migrate renders it for the configured
// schema and table. The SQLite files are under migrations/sqlite; the
// PostgreSQL ones are those of dedup/pgdedup, so both stores can share one
// table.
type Migration = sqlstore.Migration

// Migrations returns the embedded migrations of dialect d in version order.
func Migrations(d Dialect) ([]Migration, error) {
	var (
		ms  []Migration
		err error
	)
	switch d {
	case Postgres:
		ms, err = sqlstore.Postgres()
	case SQLite:
		ms, err = sqlstore.Load(sqliteMigrations, "migrations/sqlite")
	default:
		return nil, &idemq.ConfigError{Field: "sqldedup.Migrations(d)", Reason: fmt.Sprintf("unknown Dialect %q", d)}
	}
	if err != nil {
		return nil, fmt.Errorf("sqldedup: %w", err)
	}
	return ms, nil
}

// render rewrites migration SQL written for the default table name so that it
// applies to the configured schema and table. Names were validated in New.
func (s *Store) render(query string) string {
	return sqlstore.Render(query, s.q.table, s.cfg.Table, quoteIdent)
}

// versionsTable is the table that lists applied migrations. Its name is the
// one dedup/pgdedup uses, so a PostgreSQL table migrated by either store is
// recognised by the other.
func (s *Store) versionsTable() string {
	t := quoteIdent(s.cfg.Table + "_migrations")
	if s.cfg.Dialect == Postgres {
		t = quoteIdent(s.cfg.Schema) + "." + t
	}
	return t
}

// MigrationSQL returns the SQL that Migrate would apply on an empty database,
// rendered for the configured dialect, schema and table, for review or for
// other migration tools.
func (s *Store) MigrationSQL() (string, error) {
	ms, err := Migrations(s.cfg.Dialect)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	if s.cfg.Dialect == Postgres {
		fmt.Fprintf(&b, "CREATE SCHEMA IF NOT EXISTS %s;\n\n", quoteIdent(s.cfg.Schema))
	}
	for _, m := range ms {
		fmt.Fprintf(&b, "-- %s\n%s\n\n", m.Name, s.render(m.Up))
	}
	return b.String(), nil
}

// Migrate creates the schema (PostgreSQL) and applies every migration not yet
// applied, in one transaction. Concurrent calls are serialised (an advisory
// lock on PostgreSQL, the write lock on SQLite), so every worker may call it
// at start-up.
func (s *Store) Migrate(ctx context.Context) error {
	_, err := s.ApplyMigrations(ctx)
	return err
}

// ApplyMigrations is Migrate that also returns the migrations it applied, in
// version order: none when the table was already up to date. Of concurrent
// calls, only the first to take the lock applies and reports them.
func (s *Store) ApplyMigrations(ctx context.Context) ([]Migration, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("sqldedup: migrate: %w", err)
	}
	defer tx.Rollback() // safe after commit
	applied, err := s.migrateTx(ctx, tx)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("sqldedup: migrate: commit: %w", err)
	}
	return applied, nil
}

// MigrateTx is Migrate inside the caller's transaction, for applications that
// run their own migrations in one transaction.
func (s *Store) MigrateTx(ctx context.Context, tx *sql.Tx) error {
	_, err := s.migrateTx(ctx, tx)
	return err
}

// migrateTx applies the pending migrations in tx and returns them.
func (s *Store) migrateTx(ctx context.Context, tx *sql.Tx) ([]Migration, error) {
	ms, err := Migrations(s.cfg.Dialect)
	if err != nil {
		return nil, err
	}
	versions := s.versionsTable()
	var steps []string
	switch s.cfg.Dialect {
	case Postgres:
		steps = []string{
			`SELECT pg_advisory_xact_lock(hashtext('idemq.pgdedup.migrate'))`,
			`CREATE SCHEMA IF NOT EXISTS ` + quoteIdent(s.cfg.Schema),
			`CREATE TABLE IF NOT EXISTS ` + versions + ` (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`,
		}
	default:
		steps = []string{
			`CREATE TABLE IF NOT EXISTS ` + versions + ` (
    version    INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP
)`,
			// A write as the first data statement takes SQLite's write
			// lock, so concurrent migrations in deferred transactions
			// serialise instead of failing on upgrade.
			`DELETE FROM ` + versions + ` WHERE version < 0`,
		}
	}
	for _, q := range steps {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return nil, fmt.Errorf("sqldedup: migrate: %w", err)
		}
	}
	done, err := appliedVersions(ctx, tx, versions)
	if err != nil {
		return nil, fmt.Errorf("sqldedup: migrate: %w", err)
	}
	insert := `INSERT INTO ` + versions + ` (version, name) VALUES (` + s.q.ph(1) + `, ` + s.q.ph(2) + `)`
	pending := sqlstore.Pending(ms, done)
	for _, m := range pending {
		for _, stmt := range splitStatements(s.render(m.Up)) {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return nil, fmt.Errorf("sqldedup: migration %s: %w", m.Name, err)
			}
		}
		if _, err := tx.ExecContext(ctx, insert, m.Version, m.Name); err != nil {
			return nil, fmt.Errorf("sqldedup: migration %s: %w", m.Name, err)
		}
	}
	return pending, nil
}

func appliedVersions(ctx context.Context, tx *sql.Tx, versions string) ([]int, error) {
	rows, err := tx.QueryContext(ctx, `SELECT version FROM `+versions)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var done []int
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		done = append(done, v)
	}
	return done, rows.Err()
}

// splitStatements splits migration SQL on the semicolons that end a line, so
// that every driver can run it (some run one statement per call). Comment
// lines are dropped.
func splitStatements(sql string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.Lines(sql) {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		if strings.HasSuffix(trimmed, ";") {
			if stmt := strings.TrimSpace(cur.String()); stmt != ";" {
				out = append(out, strings.TrimSuffix(stmt, ";"))
			}
			cur.Reset()
		}
	}
	if stmt := strings.TrimSpace(cur.String()); stmt != "" {
		out = append(out, stmt)
	}
	return out
}

// CheckSchema implements dedup.SchemaChecker: one statement that reads no
// row checks that the record table and its failure table exist with every
// column of the latest migration. It returns a *dedup.SchemaError (matching
// dedup.ErrNotMigrated) naming Migrate when they do not, and the database's
// error when it could not be asked. The Runner calls it when Run starts.
func (s *Store) CheckSchema(ctx context.Context) error {
	var one int
	err := s.db.QueryRowContext(ctx, sqlstore.SchemaProbe(s.q.table, s.failuresTable())).Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case sqlstore.Undefined(err):
		table := s.cfg.Table
		if s.cfg.Dialect == Postgres {
			table = s.cfg.Schema + "." + table
		}
		return &dedup.SchemaError{Table: table, Migrate: "create it with sqldedup.Store.Migrate (or run `idemq migrate`, or apply MigrationSQL)", Err: err}
	case err != nil:
		return fmt.Errorf("sqldedup: check schema: %w", err)
	}
	return nil
}
