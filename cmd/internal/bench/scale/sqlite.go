package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // the database/sql driver sqldedup.OpenSQLite opens

	"github.com/idemq/idemq/cmd/internal/bench/pgload"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/sqldedup"
)

// sqliteSize measures the SQLite store at n records: the Runner (batch
// API, batch -batch, concurrency 1: SQLite has one writer) claims n new
// UUID keys into a file of its own (sqldedup.OpenSQLite: WAL,
// synchronous=FULL) as fast as it goes, then it prints the claims/s of the
// last tenth, the file's bytes per record (page_count × page_size, after a
// checkpoint of the WAL) and their extrapolation to target records.
func sqliteSize(ctx context.Context, n, target, batch int) error {
	dir, err := os.MkdirTemp("", "idemq-bench-scale-sqlite-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db, err := sqldedup.OpenSQLite(ctx, filepath.Join(dir, "dedup.db"))
	if err != nil {
		return err
	}
	defer db.Close()
	store, err := sqldedup.New(db, sqldedup.Config{Dialect: sqldedup.SQLite})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	var keys atomic.Int64
	src := &pgload.Source{Keys: &keys, Key: pgload.UUID}
	path := consumer.TransactionalBatch(store, func(context.Context, *sql.Tx, []*consumer.Message) error { return nil })
	runner, err := consumer.NewRunner(src, path, consumer.Config{Name: fillScopes[0], Concurrency: 1, BatchSize: batch})
	if err != nil {
		return err
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	rerr := make(chan error, 1)
	start := time.Now()
	go func() { rerr <- runner.Run(rctx) }()
	var tenth time.Time
	var tenthAt int64
	for src.Acked.Load() < int64(n) {
		select {
		case err := <-rerr:
			return fmt.Errorf("sqlite: runner stopped early: %w", err)
		case <-ctx.Done():
			stop()
			return errors.Join(ctx.Err(), <-rerr)
		case <-time.After(100 * time.Millisecond):
		}
		if tenth.IsZero() && src.Acked.Load() >= int64(n)*9/10 {
			tenth, tenthAt = time.Now(), src.Acked.Load()
		}
	}
	stop()
	if err := <-rerr; err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("sqlite: runner: %w", err)
	}
	end, acked := time.Now(), src.Acked.Load()
	var records, pages, pageSize int64
	if _, err := db.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		return err
	}
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM processed_messages`).Scan(&records); err != nil {
		return err
	}
	if err := db.QueryRowContext(ctx, `PRAGMA page_count`).Scan(&pages); err != nil {
		return err
	}
	if err := db.QueryRowContext(ctx, `PRAGMA page_size`).Scan(&pageSize); err != nil {
		return err
	}
	per := float64(pages*pageSize) / float64(records)
	fmt.Printf("\nsqlite: %d records claimed in %.1f s (batch %d, concurrency 1), %.0f claims/s over the last tenth; file %s: %.0f bytes per record (table and primary key); at %d records: %.1f GiB\n",
		records, end.Sub(start).Seconds(), batch, float64(acked-tenthAt)/end.Sub(tenth).Seconds(), pgload.MiB(pages*pageSize), per, target, per*float64(target)/(1<<30))
	return nil
}
