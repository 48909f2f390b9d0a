package pgdedup

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migration is one numbered schema change. The files under migrations/ are
// plain SQL with goose annotations, written for the default table name in
// the connection's search_path; Migrate renders them for the configured
// schema and table.
type Migration struct {
	// Version orders migrations; it is the number the file name starts with.
	Version int
	// Name is the file name.
	Name string
	// Up is the SQL that applies the migration, for the default table name.
	Up string
	// Down is the SQL that reverts it, for the default table name.
	Down string
}

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	names, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	ms := make([]Migration, 0, len(names))
	for _, name := range names {
		b, err := migrationFiles.ReadFile(name)
		if err != nil {
			return nil, err
		}
		base := strings.TrimPrefix(name, "migrations/")
		num, _, _ := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if err != nil {
			return nil, fmt.Errorf("pgdedup: migration %s: file name must start with its version: %w", base, err)
		}
		up, down, ok := strings.Cut(string(b), "-- +goose Down")
		if !ok {
			return nil, fmt.Errorf("pgdedup: migration %s has no -- +goose Down section", base)
		}
		_, up, _ = strings.Cut(up, "-- +goose Up")
		ms = append(ms, Migration{Version: v, Name: base, Up: strings.TrimSpace(up), Down: strings.TrimSpace(down)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	return ms, nil
}

var defaultNameRE = regexp.MustCompile(`\bprocessed_messages(_[a-z_]+)?\b`)

// render rewrites migration SQL written for the default table name so that it
// applies to the configured schema and table. Names were validated in New.
func (s *Store) render(sql string) string {
	return defaultNameRE.ReplaceAllStringFunc(sql, func(m string) string {
		if suffix := strings.TrimPrefix(m, DefaultTable); suffix != "" {
			return pgx.Identifier{s.cfg.Table + suffix}.Sanitize() // index names
		}
		return s.q.table
	})
}

// MigrationSQL returns the SQL that Migrate would apply on an empty database,
// rendered for the configured schema and table, for review or for other
// migration tools.
func (s *Store) MigrationSQL() (string, error) {
	ms, err := Migrations()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "CREATE SCHEMA IF NOT EXISTS %s;\n\n", pgx.Identifier{s.cfg.Schema}.Sanitize())
	for _, m := range ms {
		fmt.Fprintf(&b, "-- %s\n%s\n\n", m.Name, s.render(m.Up))
	}
	return b.String(), nil
}

// Migrate creates the schema and applies every migration not yet applied, in
// one transaction. Concurrent calls are serialised by an advisory lock, so
// every worker may call it at start-up.
func (s *Store) Migrate(ctx context.Context) error {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgdedup: migrate: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // safe after commit
	if err := s.MigrateTx(ctx, tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgdedup: migrate: commit: %w", err)
	}
	return nil
}

// MigrateTx is Migrate inside the caller's transaction, for applications that
// run their own migrations in one transaction.
func (s *Store) MigrateTx(ctx context.Context, tx pgx.Tx) error {
	ms, err := Migrations()
	if err != nil {
		return err
	}
	versions := pgx.Identifier{s.cfg.Schema, s.cfg.Table + "_migrations"}.Sanitize()
	steps := []string{
		`SELECT pg_advisory_xact_lock(hashtext('idemq.pgdedup.migrate'))`,
		`CREATE SCHEMA IF NOT EXISTS ` + pgx.Identifier{s.cfg.Schema}.Sanitize(),
		`CREATE TABLE IF NOT EXISTS ` + versions + ` (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`,
	}
	for _, sql := range steps {
		if _, err := tx.Exec(ctx, sql); err != nil {
			return fmt.Errorf("pgdedup: migrate: %w", err)
		}
	}
	rows, err := tx.Query(ctx, `SELECT version FROM `+versions)
	if err != nil {
		return fmt.Errorf("pgdedup: migrate: %w", err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return fmt.Errorf("pgdedup: migrate: %w", err)
	}
	done := make(map[int]bool, len(applied))
	for _, v := range applied {
		done[int(v)] = true
	}
	for _, m := range ms {
		if done[m.Version] {
			continue
		}
		if _, err := tx.Exec(ctx, s.render(m.Up)); err != nil {
			return fmt.Errorf("pgdedup: migration %s: %w", m.Name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+versions+` (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
			return fmt.Errorf("pgdedup: migration %s: %w", m.Name, err)
		}
	}
	return nil
}
