package migrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/idemq/idemq"
)

// Migrator applies the migrations of one Config to one database: a pgx pool
// or connection (NewPgx, transactions of type pgx.Tx) or a database/sql
// handle (NewSQL, transactions of type *sql.Tx). It is safe for concurrent
// use; so are concurrent Migrate calls from several processes (see
// Migrate).
type Migrator[TTx any] struct {
	*plan
	db driver[TTx]
}

// PgxTx is what a Migrator needs of a pgx transaction: pgx.Tx has it. The
// package names no pgx type, so that a program on database/sql alone does
// not link pgx; Tag and Row are pgconn.CommandTag and pgx.Row, inferred.
type PgxTx[Tag any, Row interface{ Scan(dest ...any) error }] interface {
	Exec(ctx context.Context, sql string, args ...any) (Tag, error)
	QueryRow(ctx context.Context, sql string, args ...any) Row
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// PgxBeginner is what NewPgx needs of pgx: *pgxpool.Pool and *pgx.Conn
// fit, with TTx pgx.Tx.
type PgxBeginner[TTx any] interface {
	Begin(ctx context.Context) (TTx, error)
}

// NewPgx returns a Migrator for cfg (whose Dialect must be Postgres or
// empty) on db, a *pgxpool.Pool or *pgx.Conn: its type arguments are
// inferred, and its transactions are pgx.Tx. To print the SQL without a
// database, use NewSQL(nil, cfg). It returns an *idemq.ConfigError for an
// invalid cfg.
func NewPgx[TTx PgxTx[Tag, Row], Tag any, Row interface{ Scan(dest ...any) error }](db PgxBeginner[TTx], cfg Config) (*Migrator[TTx], error) {
	if cfg.Dialect != "" && cfg.Dialect != Postgres {
		return nil, &idemq.ConfigError{Field: "migrate.Config.Dialect", Reason: fmt.Sprintf("%q: NewPgx is for PostgreSQL; use NewSQL", cfg.Dialect)}
	}
	p, err := newPlan("migrate.NewPgx(cfg)", cfg)
	if err != nil {
		return nil, err
	}
	return &Migrator[TTx]{plan: p, db: pgxDriver[TTx, Tag, Row]{db: db}}, nil
}

// SQLBeginner is what NewSQL needs of database/sql: *sql.DB and *sql.Conn
// fit.
type SQLBeginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// NewSQL returns a Migrator for cfg on db, a database of cfg.Dialect. db
// may be nil when only SQL and AllVersions are called. It returns an
// *idemq.ConfigError for an invalid cfg.
func NewSQL(db SQLBeginner, cfg Config) (*Migrator[*sql.Tx], error) {
	p, err := newPlan("migrate.NewSQL(cfg)", cfg)
	if err != nil {
		return nil, err
	}
	return &Migrator[*sql.Tx]{plan: p, db: sqlDriver{db: db}}, nil
}

// Config returns the Migrator's configuration, with its defaults filled in.
func (m *Migrator[TTx]) Config() Config { return m.cfg }

// Table returns the migrated table's name as messages give it:
// schema-qualified when it has a schema.
func (m *Migrator[TTx]) Table() string { return m.table }

// AllVersions returns every migration of the line, rendered for the
// Config, in version order.
func (m *Migrator[TTx]) AllVersions() []Migration { return slices.Clone(m.migrations) }

// SQL returns the SQL that Migrate applies to an empty database, rendered
// for the Config, for review or for another migration tool: the schema
// statements (PostgreSQL), then the Up section of every migration. It does
// not include the versions table that Migrate keeps.
func (m *Migrator[TTx]) SQL() string { return m.script() }

// Migrate applies, in one transaction, every migration not yet applied, and
// returns them in version order: none when the table was up to date.
// Concurrent calls, from this process or others, are serialised (an
// advisory lock on PostgreSQL, the write lock on SQLite), so every worker
// may call it at start-up; of concurrent calls, only the first applies and
// reports the migrations.
func (m *Migrator[TTx]) Migrate(ctx context.Context) ([]Migration, error) {
	tx, err := m.begin(ctx, "")
	if err != nil {
		return nil, err
	}
	defer m.db.rollback(ctx, tx) // safe after commit
	applied, err := m.MigrateTx(ctx, tx)
	if err != nil {
		return nil, err
	}
	if err := m.db.commit(ctx, tx); err != nil {
		return nil, fmt.Errorf("migrate %s: commit: %w", m.table, err)
	}
	return applied, nil
}

// MigrateTx is Migrate inside the caller's transaction tx, for
// applications that run their own migrations in one transaction; nothing
// is applied until tx commits. On PostgreSQL the Outbox line with a Schema
// sets tx's search_path to it (SET LOCAL).
func (m *Migrator[TTx]) MigrateTx(ctx context.Context, tx TTx) ([]Migration, error) {
	var steps []string
	if m.cfg.Dialect == Postgres {
		steps = append(steps, `SELECT pg_advisory_xact_lock(hashtext('`+m.lockKey+`'))`)
		steps = append(steps, m.enter...)
		steps = append(steps, `CREATE TABLE IF NOT EXISTS `+m.versions+` (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`)
	} else {
		steps = append(steps, `CREATE TABLE IF NOT EXISTS `+m.versions+` (
    version    INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP
)`,
			// A write as the first data statement takes SQLite's write
			// lock, so concurrent migrations in deferred transactions
			// serialise instead of failing on upgrade.
			`DELETE FROM `+m.versions+` WHERE version < 0`)
	}
	for _, q := range steps {
		if err := m.db.exec(ctx, tx, q); err != nil {
			return nil, fmt.Errorf("migrate %s: %w", m.table, err)
		}
	}
	done, err := m.readVersions(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("migrate %s: %w", m.table, err)
	}
	var pending []Migration
	for _, mg := range m.migrations {
		if !slices.ContainsFunc(done, func(d Migration) bool { return d.Version == mg.Version }) {
			pending = append(pending, mg)
		}
	}
	ph1, ph2 := "$1", "$2"
	if m.cfg.Dialect == SQLite {
		ph1, ph2 = "?1", "?2"
	}
	insert := `INSERT INTO ` + m.versions + ` (version, name) VALUES (` + ph1 + `, ` + ph2 + `)`
	for _, mg := range pending {
		if err := m.apply(ctx, tx, mg); err != nil {
			return nil, fmt.Errorf("migrate %s: %s: %w", m.table, mg.Name, err)
		}
		if err := m.db.exec(ctx, tx, insert, mg.Version, mg.Name); err != nil {
			return nil, fmt.Errorf("migrate %s: %s: %w", m.table, mg.Name, err)
		}
	}
	return pending, nil
}

// apply runs the Up section of mg in tx: in one call on PostgreSQL, one
// statement at a time on SQLite, where an ADD COLUMN of a column that
// exists is skipped (SQLite has no ADD COLUMN IF NOT EXISTS, and a table
// made before the versions table was kept may have it).
func (m *Migrator[TTx]) apply(ctx context.Context, tx TTx, mg Migration) error {
	if m.cfg.Dialect == Postgres {
		return m.db.exec(ctx, tx, mg.Up)
	}
	for _, stmt := range splitStatements(mg.Up) {
		if c := addColumn.FindStringSubmatch(stmt); c != nil {
			has, err := m.exists(ctx, tx, `SELECT count(*) > 0 FROM pragma_table_info(?1) WHERE name = ?2`, c[1], c[2])
			if err != nil {
				return err
			}
			if has {
				continue
			}
		}
		if err := m.db.exec(ctx, tx, stmt); err != nil {
			return err
		}
	}
	return nil
}

// Prepare readies an unpartitioned processed-message table for the
// migration that partitions it (Config.Partitioned) without blocking its
// writes, so that Migrate then holds the table's lock for catalog changes
// only (docs/operations.md has the measured times): it builds the unique
// index on (scope, key, processed_at) with CREATE INDEX CONCURRENTLY, and
// proves that every row is before the first partition's end with a CHECK
// constraint added NOT VALID (a brief exclusive lock, waited for at most
// lock_timeout, 1 s) and validated while writes go on. Migrate drops the
// constraint. Call Migrate the same day: until then the constraint refuses
// records dated after the day after tomorrow (UTC).
//
// It does nothing for the Outbox line (its migration builds what it needs
// while writes wait), when Config.Partitioned is false, the table does not
// exist or is already partitioned. The database must be a *pgxpool.Pool,
// a *pgx.Conn (NewPgx) or a *sql.DB (NewSQL): the index is built outside a
// transaction. An index left invalid by an interrupted build is dropped and
// built again.
func (m *Migrator[TTx]) Prepare(ctx context.Context) error {
	if !m.cfg.Partitioned || m.cfg.Line != Dedup {
		return nil
	}
	table, name := quote(m.cfg.Schema)+"."+quote(m.cfg.Table), m.cfg.Table
	tx, err := m.begin(ctx, "prepare: ")
	if err != nil {
		return err
	}
	var unpartitioned, invalid bool
	err = func() error {
		defer m.db.rollback(ctx, tx)
		if unpartitioned, err = m.exists(ctx, tx, `SELECT coalesce((SELECT relkind = 'r' FROM pg_class WHERE oid = to_regclass($1)), false)`, table); err != nil {
			return err
		}
		invalid, err = m.exists(ctx, tx, `SELECT coalesce((SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)), false)`,
			quote(m.cfg.Schema)+"."+quote(name+"_partition_idx"))
		return err
	}()
	if err != nil || !unpartitioned {
		return err
	}
	var steps []string
	if invalid {
		steps = append(steps, `DROP INDEX CONCURRENTLY IF EXISTS `+quote(m.cfg.Schema)+"."+quote(name+"_partition_idx"))
	}
	bound := quote(name + "_partition_bound")
	steps = append(steps,
		`CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS `+quote(name+"_partition_idx")+` ON `+table+` (scope, key, processed_at)`,
		`DO $$ BEGIN
    SET LOCAL lock_timeout = '1s';
    IF NOT EXISTS (SELECT FROM pg_constraint WHERE conrelid = '`+table+`'::regclass AND conname = '`+name+`_partition_bound') THEN
        EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %s CHECK (processed_at < %L) NOT VALID', '`+table+`', '`+bound+`',
            ((now() AT TIME ZONE 'UTC')::date + 2)::timestamp AT TIME ZONE 'UTC');
    END IF;
END $$`,
		`ALTER TABLE `+table+` VALIDATE CONSTRAINT `+bound)
	for _, q := range steps {
		if err := m.db.execNoTx(ctx, q); err != nil {
			return fmt.Errorf("migrate %s: prepare: %w", m.table, err)
		}
	}
	return nil
}

// ExistingVersions returns the migrations recorded as applied, in version
// order: none when the versions table does not exist. A version this
// program does not know (applied by a newer one) has only its Version and
// Name.
func (m *Migrator[TTx]) ExistingVersions(ctx context.Context) ([]Migration, error) {
	tx, err := m.begin(ctx, "")
	if err != nil {
		return nil, err
	}
	defer m.db.rollback(ctx, tx)
	probe := `SELECT to_regclass($1) IS NOT NULL`
	name := m.versions
	if m.cfg.Dialect == SQLite {
		probe = `SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?1`
		name = m.versions[1 : len(m.versions)-1] // unquoted: SQLite has no schema
	}
	ok, err := m.exists(ctx, tx, probe, name)
	if err != nil {
		return nil, fmt.Errorf("migrate %s: %w", m.table, err)
	}
	if !ok {
		return nil, nil
	}
	done, err := m.readVersions(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("migrate %s: %w", m.table, err)
	}
	for i, d := range done {
		if j := slices.IndexFunc(m.migrations, func(mg Migration) bool { return mg.Version == d.Version }); j >= 0 {
			done[i] = m.migrations[j]
		}
	}
	return done, nil
}

// exists runs query, which returns one boolean, in tx.
func (m *Migrator[TTx]) exists(ctx context.Context, tx TTx, query string, args ...any) (bool, error) {
	var ok bool
	err := m.db.scan(ctx, tx, query, &ok, args...)
	return ok, err
}

// readVersions reads the versions table in tx, in version order: in one row,
// so that a pgx transaction needs no Query.
func (m *Migrator[TTx]) readVersions(ctx context.Context, tx TTx) ([]Migration, error) {
	agg := `string_agg(version::text || ' ' || name, E'\n')`
	if m.cfg.Dialect == SQLite {
		agg = `group_concat(version || ' ' || name, char(10))`
	}
	var all string
	if err := m.db.scan(ctx, tx, `SELECT coalesce(`+agg+`, '') FROM `+m.versions, &all); err != nil {
		return nil, err
	}
	var out []Migration
	for line := range strings.Lines(all) {
		num, name, _ := strings.Cut(strings.TrimSpace(line), " ")
		v, err := strconv.Atoi(num)
		if err != nil {
			return nil, fmt.Errorf("versions table: %q: %w", line, err)
		}
		out = append(out, Migration{Version: v, Name: name})
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	return out, nil
}

// errNoDB is returned by the methods that need a database when the
// Migrator was made without one.
var errNoDB = errors.New("migrate: the Migrator has no database (NewSQL with nil)")

// begin starts a transaction on the Migrator's database for what it is
// doing (a prefix of its error), or returns errNoDB.
func (m *Migrator[TTx]) begin(ctx context.Context, doing string) (tx TTx, err error) {
	if m.db.isNil() {
		return tx, errNoDB
	}
	if tx, err = m.db.begin(ctx); err != nil {
		err = fmt.Errorf("migrate %s: %s%w", m.table, doing, err)
	}
	return tx, err
}

// driver is what a Migrator needs of a database library.
type driver[TTx any] interface {
	isNil() bool
	begin(ctx context.Context) (TTx, error)
	commit(ctx context.Context, tx TTx) error
	rollback(ctx context.Context, tx TTx)
	exec(ctx context.Context, tx TTx, sql string, args ...any) error
	// scan reads the one column of the first row of sql into dest.
	scan(ctx context.Context, tx TTx, sql string, dest any, args ...any) error
	// execNoTx runs sql outside a transaction, when the database can.
	execNoTx(ctx context.Context, sql string) error
}

// errNeedsPool is execNoTx's error for a database that can only begin
// transactions.
var errNeedsPool = errors.New("needs a statement outside a transaction: give a *pgxpool.Pool, *pgx.Conn or *sql.DB")

type pgxDriver[TTx PgxTx[Tag, Row], Tag any, Row interface{ Scan(dest ...any) error }] struct {
	db PgxBeginner[TTx]
}

func (d pgxDriver[TTx, Tag, Row]) isNil() bool { return d.db == nil }

func (d pgxDriver[TTx, Tag, Row]) begin(ctx context.Context) (TTx, error) { return d.db.Begin(ctx) }

func (pgxDriver[TTx, Tag, Row]) commit(ctx context.Context, tx TTx) error { return tx.Commit(ctx) }

func (pgxDriver[TTx, Tag, Row]) rollback(ctx context.Context, tx TTx) { _ = tx.Rollback(ctx) }

func (pgxDriver[TTx, Tag, Row]) exec(ctx context.Context, tx TTx, sql string, args ...any) error {
	_, err := tx.Exec(ctx, sql, args...)
	return err
}

func (pgxDriver[TTx, Tag, Row]) scan(ctx context.Context, tx TTx, sql string, dest any, args ...any) error {
	return tx.QueryRow(ctx, sql, args...).Scan(dest)
}

func (d pgxDriver[TTx, Tag, Row]) execNoTx(ctx context.Context, sql string) error {
	e, ok := d.db.(interface {
		Exec(ctx context.Context, sql string, args ...any) (Tag, error)
	})
	if !ok {
		return errNeedsPool
	}
	_, err := e.Exec(ctx, sql)
	return err
}

type sqlDriver struct{ db SQLBeginner }

func (d sqlDriver) execNoTx(ctx context.Context, query string) error {
	e, ok := d.db.(interface {
		ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	})
	if !ok {
		return errNeedsPool
	}
	_, err := e.ExecContext(ctx, query)
	return err
}

func (d sqlDriver) isNil() bool { return d.db == nil }

func (d sqlDriver) begin(ctx context.Context) (*sql.Tx, error) { return d.db.BeginTx(ctx, nil) }

func (sqlDriver) commit(_ context.Context, tx *sql.Tx) error { return tx.Commit() }

func (sqlDriver) rollback(_ context.Context, tx *sql.Tx) { _ = tx.Rollback() }

func (sqlDriver) exec(ctx context.Context, tx *sql.Tx, query string, args ...any) error {
	_, err := tx.ExecContext(ctx, query, args...)
	return err
}

func (sqlDriver) scan(ctx context.Context, tx *sql.Tx, query string, dest any, args ...any) error {
	return tx.QueryRowContext(ctx, query, args...).Scan(dest)
}

// Compile-time check that the database/sql driver fits.
var _ driver[*sql.Tx] = sqlDriver{}
