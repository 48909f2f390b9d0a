// Command wrongtx must not compile: TestWrongTxDoesNotCompile builds it to
// check that outbox.Publish and migrate.NewPgx refuse a wrong type at
// compile time.
package main

import (
	"context"
	"database/sql"

	"github.com/idemq/idemq/dedup/migrate"
	"github.com/idemq/idemq/sinks/outbox"
)

func main() {
	ctx := context.Background()
	var tx *sql.Tx
	var db *sql.DB
	_, _ = outbox.Publish(ctx, tx, outbox.Message{ID: "x"}) // a *sql.Tx: PublishSQL
	_, _ = migrate.NewPgx(db, migrate.Config{})             // a *sql.DB: NewSQL
	_, _ = outbox.PublishSQL(ctx, struct{}{}, outbox.Message{ID: "x"})
}
