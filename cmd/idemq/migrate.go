package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/idemq/idemq/dedup/migrate"
	"github.com/idemq/idemq/dedup/sqldedup"
)

// runMigrate applies, prints (--print) or lists (--status) the migrations
// of the processed-messages table, or of the outbox table (--outbox),
// through dedup/migrate.
func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("migrate", stderr)
	var sf storeFlags
	sf.register(fs)
	print := fs.Bool("print", false, "print the SQL instead of applying it (no connection is made, so no --dsn is needed: without one, PostgreSQL's SQL)")
	status := fs.Bool("status", false, "list the applied and the pending migrations instead of applying them")
	outboxTable := fs.Bool("outbox", false, "the outbox table's migrations (sinks/outbox) instead of the processed-messages table's")
	partitioned := fs.Bool("partitioned", false, "partition the processed-messages table by day (PostgreSQL, for pgdedup.Config.Partitioned): the index and the bound are made first without blocking writes, then the table becomes the first partition")
	if pos, err := parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, pos)
	}
	if *print && sf.dsn == "" {
		// The DSN only chooses the dialect of the SQL printed.
		sf.dsn = "postgres://"
	}
	dialect, source, err := dialectOf(sf.dsn)
	if err != nil {
		return err
	}
	if dialect == sqldedup.SQLite && sf.schema != "" {
		return fmt.Errorf("%w: --schema is for PostgreSQL; SQLite has none", errUsage)
	}
	cfg := migrate.Config{Line: migrate.Dedup, Dialect: dialect, Schema: sf.schema, Table: sf.table, Partitioned: *partitioned}
	if *outboxTable {
		cfg.Line = migrate.Outbox
	}
	// Validate the names before any connection or file is made.
	m, err := migrate.NewSQL(nil, cfg)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if *print {
		fmt.Fprint(stdout, m.SQL())
		return nil
	}
	// Building the partitioning's index of a large table takes longer.
	limit := time.Minute
	if *partitioned {
		limit = time.Hour
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	mode := createDB
	if *status {
		mode = existingDB
	}
	db, err := openSQL(ctx, dialect, source, mode, m.Table())
	if err != nil {
		return err
	}
	defer db.Close()
	if m, err = migrate.NewSQL(db, cfg); err != nil {
		return err
	}
	where := m.Table()
	if *status {
		return migrateStatus(ctx, m, stdout)
	}
	start := time.Now()
	if err := m.Prepare(ctx); err != nil {
		return err
	}
	if *partitioned {
		fmt.Fprintf(stdout, "prepared %s for partitioning in %s, writes going on\n", where, time.Since(start).Round(time.Millisecond))
	}
	start = time.Now()
	applied, err := m.Migrate(ctx)
	if err != nil {
		return err
	}
	if *partitioned && len(applied) > 0 {
		fmt.Fprintf(stdout, "the migrations held %s's lock for %s\n", where, time.Since(start).Round(time.Millisecond))
	}
	if len(applied) == 0 {
		fmt.Fprintf(stdout, "%s (%s) is already up to date: no migration applied\n", where, dialect)
		return nil
	}
	for _, mg := range applied {
		fmt.Fprintf(stdout, "applied migration %d (%s) to %s (%s)\n", mg.Version, mg.Name, where, dialect)
	}
	fmt.Fprintf(stdout, "%s (%s) is up to date\n", where, dialect)
	return nil
}

// migrateStatus prints each migration of m as applied or pending, and any
// applied version this program does not know.
func migrateStatus[TTx any](ctx context.Context, m *migrate.Migrator[TTx], stdout io.Writer) error {
	done, err := m.ExistingVersions(ctx)
	if err != nil {
		return err
	}
	applied := map[int]bool{}
	for _, d := range done {
		applied[d.Version] = true
	}
	pending := 0
	for _, mg := range m.AllVersions() {
		state := "pending"
		if applied[mg.Version] {
			state = "applied"
			delete(applied, mg.Version)
		} else {
			pending++
		}
		fmt.Fprintf(stdout, "%-8s %d (%s)\n", state, mg.Version, mg.Name)
	}
	for _, d := range done {
		if applied[d.Version] {
			fmt.Fprintf(stdout, "applied  %d (%s), unknown to this idemq: a newer one applied it\n", d.Version, d.Name)
		}
	}
	fmt.Fprintf(stdout, "%s (%s): %d pending\n", m.Table(), m.Config().Dialect, pending)
	return nil
}
