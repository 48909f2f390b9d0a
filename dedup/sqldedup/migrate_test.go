package sqldedup_test

import (
	"strings"
	"testing"

	"github.com/idemq/idemq/dedup/migrate"
)

// dedup/migrate on SQLite: each line's first Migrate applies and records
// every migration, the second none, and the table answers a query over
// the columns of the latest migration.
func TestMigrateSQLite(t *testing.T) {
	probes := map[migrate.Line]string{
		migrate.Dedup:  `SELECT scope, key, payload_hash, processed_at, expires_at, result FROM "custom_records" WHERE 1 = 0`,
		migrate.Outbox: `SELECT seq, id, source_key, destination, partition_key, routing_key, headers, body, state FROM idemq_outbox WHERE 1 = 0`,
	}
	for _, line := range []migrate.Line{migrate.Dedup, migrate.Outbox} {
		t.Run(string(line), func(t *testing.T) {
			db, ctx := sqliteFile(t), testCtx(t)
			cfg := migrate.Config{Line: line, Dialect: migrate.SQLite}
			if line == migrate.Dedup {
				cfg.Table = "custom_records"
			}
			m, err := migrate.NewSQL(db, cfg)
			if err != nil {
				t.Fatal(err)
			}
			all := m.AllVersions()
			if before, err := m.ExistingVersions(ctx); err != nil || len(before) != 0 {
				t.Fatalf("ExistingVersions before Migrate = %v, %v; want none", before, err)
			}
			if got, err := m.Migrate(ctx); err != nil || len(got) != len(all) {
				t.Fatalf("first Migrate = %d migrations, %v; want %d", len(got), err, len(all))
			}
			if again, err := m.Migrate(ctx); err != nil || len(again) != 0 {
				t.Fatalf("second Migrate = %v, %v; want none", again, err)
			}
			if done, err := m.ExistingVersions(ctx); err != nil || len(done) != len(all) || done[len(done)-1].Name != all[len(all)-1].Name {
				t.Fatalf("ExistingVersions = %v, %v; want every migration", done, err)
			}
			if _, err := db.ExecContext(ctx, probes[line]); err != nil {
				t.Fatalf("table after Migrate: %v", err)
			}
		})
	}
}

// An outbox table made before its versions were recorded (every column
// there; SQLite's ADD COLUMN has no IF NOT EXISTS) is brought under
// versioning without an error.
func TestMigrateOutboxBeforeVersions(t *testing.T) {
	db, ctx := sqliteFile(t), testCtx(t)
	m, err := migrate.NewSQL(db, migrate.Config{Line: migrate.Outbox, Dialect: migrate.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	for _, mg := range m.AllVersions() {
		for stmt := range strings.SplitSeq(mg.Up, ";\n") {
			if _, err := db.ExecContext(ctx, stmt); err != nil {
				t.Fatalf("%s: %v", mg.Name, err)
			}
		}
	}
	if got, err := m.Migrate(ctx); err != nil || len(got) != len(m.AllVersions()) {
		t.Fatalf("Migrate over an unversioned outbox table = %d, %v; want every migration recorded", len(got), err)
	}
}
