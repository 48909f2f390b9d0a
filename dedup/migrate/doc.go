// Package migrate applies idemq's embedded, numbered SQL migrations: those
// of the processed-message table (Line Dedup, used by dedup/pgdedup and
// dedup/sqldedup) and of the transactional outbox table (Line Outbox, used
// by sinks/outbox), on PostgreSQL and SQLite. It is what the stores'
// Migrate and `idemq migrate` run.
//
// A Migrator is made for one Config and one database, through pgx or
// database/sql:
//
//	m, err := migrate.NewPgx(pool, migrate.Config{Line: migrate.Outbox, Schema: "billing"})
//	applied, err := m.Migrate(ctx)          // its own transaction
//	applied, err = m.MigrateTx(ctx, tx)     // the caller's pgx.Tx
//	fmt.Print(m.SQL())                      // the SQL, applied by another tool
//	done, err := m.ExistingVersions(ctx)    // what was applied
//
// Each line keeps the versions it applied in a table of its own, named
// after its table with the suffix "_migrations", so Migrate applies each
// migration once. The files are plain SQL with goose annotations under
// sql/<line>/<dialect>, written for the default names; a Migrator renders
// them for the configured schema and table.
package migrate
