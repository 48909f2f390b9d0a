package migrate

import (
	"embed"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup/internal/sqlstore"
	"github.com/idemq/idemq/internal/cfgerr"
)

//go:embed sql/*/*/*.sql
var files embed.FS

// Line names a family of numbered migrations: one table and what belongs to
// it, with a versions table of its own.
type Line string

// The lines.
const (
	// Dedup is the processed-message table of dedup/pgdedup and
	// dedup/sqldedup, with its failure table. Both stores apply the same
	// PostgreSQL migrations, so they can share one table.
	Dedup Line = "dedup"
	// Outbox is the transactional outbox table of sinks/outbox.
	Outbox Line = "outbox"
)

// Dialect names the SQL dialect of a database.
type Dialect string

// The supported dialects.
const (
	// SQLite is SQLite 3.37 or newer, for example through modernc.org/sqlite
	// (pure Go, driver name "sqlite").
	SQLite Dialect = "sqlite"
	// Postgres is PostgreSQL 12 or newer, through pgx (NewPgx) or any
	// database/sql driver (NewSQL), for example github.com/jackc/pgx/v5/stdlib.
	Postgres Dialect = "postgres"
)

// String returns the dialect's name.
func (d Dialect) String() string { return string(d) }

// OutboxTable is the name of the outbox table that the Outbox line creates.
const OutboxTable = "idemq_outbox"

// Config says which table a Migrator migrates. The zero value is the
// processed-message table "public"."processed_messages" on PostgreSQL.
type Config struct {
	// Line is the family of migrations. Defaults to Dedup.
	Line Line
	// Dialect is the database's dialect. NewPgx accepts only Postgres.
	// Defaults to Postgres.
	Dialect Dialect
	// Schema is the PostgreSQL schema of the table, created if missing. For
	// Dedup it defaults to "public"; for Outbox, empty means the first
	// schema of the connection's search_path. It must be empty on SQLite.
	Schema string
	// Table is the processed-message table's name (Dedup only; the outbox
	// table is always OutboxTable). Defaults to "processed_messages".
	Table string
	// Partitioned adds, on PostgreSQL, the migrations that partition the
	// line's table by day: for Dedup, 004 (the processed-message table
	// becomes the first partition, for dedup/pgdedup with
	// Config.Partitioned) and 005 (the partitions' BRIN index on
	// expires_at, through which the janitor finds a partition expired);
	// for Outbox, 003 (the outbox table becomes the first partition, for
	// outbox.Config.Partitioned). Defaults to false: the table stays
	// unpartitioned.
	Partitioned bool
}

// withDefaults fills the zero fields of c.
func (c Config) withDefaults() Config {
	if c.Line == "" {
		c.Line = Dedup
	}
	if c.Dialect == "" {
		c.Dialect = Postgres
	}
	if c.Line == Dedup {
		if c.Schema == "" && c.Dialect == Postgres {
			c.Schema = "public"
		}
		if c.Table == "" {
			c.Table = sqlstore.DefaultTable
		}
	}
	return c
}

// validate adds a configuration error to l for each invalid field of c.
func (c Config) validate(l *cfgerr.List) {
	switch c.Line {
	case Dedup, Outbox:
	default:
		l.Addf("Line", "unknown Line %q", c.Line)
	}
	switch c.Dialect {
	case Postgres, SQLite:
	default:
		l.Addf("Dialect", "unknown Dialect %q", c.Dialect)
	}
	switch {
	case c.Schema != "" && c.Dialect == SQLite:
		l.Addf("Schema", "%q: SQLite has no schemas", c.Schema)
	case c.Schema != "":
		sqlstore.ValidIdent(l, "Schema", c.Schema, sqlstore.MaxSchemaBytes)
	}
	if c.Partitioned && c.Dialect != Postgres {
		l.Addf("Partitioned", "only PostgreSQL tables are partitioned")
	}
	switch {
	case c.Line == Outbox && c.Table != "":
		l.Addf("Table", "%q: the outbox table is always %s", c.Table, OutboxTable)
	case c.Line == Dedup:
		sqlstore.ValidIdent(l, "Table", c.Table, sqlstore.MaxTableBytes)
	}
}

// Migration is one numbered schema change, rendered for a Migrator's
// Config.
type Migration struct {
	// Version orders the migrations of a line; it is the number the file
	// name starts with.
	Version int
	// Name is the file name, such as "001_create_processed_messages.sql".
	Name string
	// Up is the SQL that applies the migration.
	Up string
	// Down is the SQL that reverts it. Migrator never runs it; it is there
	// for review and for other migration tools.
	Down string
}

// plan is a Config rendered: the names and statements a Migrator runs.
type plan struct {
	cfg        Config
	table      string      // the table as messages name it
	versions   string      // the versions table, quoted and qualified
	lockKey    string      // PostgreSQL: the advisory lock's key
	enter      []string    // PostgreSQL: the statements before the migrations
	migrations []Migration // rendered, in version order
}

// quote quotes a name that was validated as a plain identifier.
func quote(s string) string { return `"` + s + `"` }

// newPlan validates cfg (after its defaults) and renders its migrations.
func newPlan(field string, cfg Config) (*plan, error) {
	cfg = cfg.withDefaults()
	l := cfgerr.List{Prefix: "migrate.Config."}
	cfg.validate(&l)
	if err := l.Err(); err != nil {
		return nil, err
	}
	dir := "sql/" + string(cfg.Line) + "/" + string(cfg.Dialect)
	ms, err := load(files, dir)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	if cfg.Partitioned {
		more, err := load(files, dir+"-partitioned")
		if err != nil {
			return nil, fmt.Errorf("migrate: %w", err)
		}
		ms = append(ms, more...)
		slices.SortFunc(ms, func(a, b Migration) int { return a.Version - b.Version })
	}
	if len(ms) == 0 {
		return nil, &idemq.ConfigError{Field: field, Reason: fmt.Sprintf("no %s migrations for %s", cfg.Line, cfg.Dialect)}
	}
	p := &plan{cfg: cfg, migrations: ms}
	qualify := func(name string) string {
		if cfg.Schema == "" {
			return quote(name)
		}
		return quote(cfg.Schema) + "." + quote(name)
	}
	render := func(s string) string { return s }
	switch cfg.Line {
	case Dedup:
		p.table = cfg.Table
		p.versions = qualify(cfg.Table + "_migrations")
		// The key dedup/pgdedup has always taken, so that workers of
		// every version serialise.
		p.lockKey = "idemq.pgdedup.migrate"
		qualified := qualify(cfg.Table)
		render = func(s string) string { return sqlstore.Render(s, qualified, cfg.Table, quote) }
	case Outbox:
		// The outbox's files name their objects without a schema (its
		// notify function and channel among them): the schema is entered
		// through the search_path instead of rendered.
		p.table = OutboxTable
		p.versions = qualify(OutboxTable + "_migrations")
		p.lockKey = OutboxTable
		if cfg.Schema != "" {
			p.lockKey = qualify(OutboxTable)
		}
	}
	if cfg.Schema != "" {
		p.table = cfg.Schema + "." + p.table
		p.enter = append(p.enter, "CREATE SCHEMA IF NOT EXISTS "+quote(cfg.Schema))
		if cfg.Line == Outbox {
			p.enter = append(p.enter, "SET LOCAL search_path TO "+quote(cfg.Schema))
		}
	}
	for i := range ms {
		ms[i].Up, ms[i].Down = render(ms[i].Up), render(ms[i].Down)
	}
	return p, nil
}

// script is the SQL that migrating an empty database applies, without the
// versions table, for review or for other migration tools: the statements
// of enter (with a session-wide search_path), then every migration.
func (p *plan) script() string {
	var b strings.Builder
	for _, s := range p.enter {
		fmt.Fprintf(&b, "%s;\n", strings.Replace(s, "SET LOCAL ", "SET ", 1))
	}
	if len(p.enter) > 0 {
		b.WriteString("\n")
	}
	for _, m := range p.migrations {
		fmt.Fprintf(&b, "-- %s\n%s\n\n", m.Name, m.Up)
	}
	return b.String()
}

// addColumn matches SQLite's ADD COLUMN statements, which have no IF NOT
// EXISTS.
var addColumn = regexp.MustCompile(`(?i)^ALTER TABLE "?(\w+)"? ADD COLUMN "?(\w+)"? `)

// splitStatements splits migration SQL on the semicolons that end a line, so
// that every SQLite driver can run it (some run one statement per call).
// Comment lines are dropped.
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
