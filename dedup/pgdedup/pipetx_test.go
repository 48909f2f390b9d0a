package pgdedup

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/internal/testenv"
)

// TestPipeTxSavepoints drives the deferred savepoints through the cases that
// matter: an execution error rolls back only its message, a message that
// sent nothing rolls back nothing, and a savepoint that was never confirmed
// refuses to roll back (so nothing earlier is undone).
func TestPipeTxSavepoints(t *testing.T) {
	url := testenv.DatabaseURL(t)
	schema := testenv.Schema(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	table := pgx.Identifier{schema, "t"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (v int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	store, err := New(pool, Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	insert := func(tx pgx.Tx, v int) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1)`, v)
		return err
	}
	count := func() (n int) {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	tx, err := store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	step := func(release bool) {
		t.Helper()
		if err := store.Savepoint(ctx, tx, release); err != nil {
			t.Fatal(err)
		}
	}
	step(false)
	if err := insert(tx, 1); err != nil { // message 1 commits
		t.Fatal(err)
	}
	step(true)
	if err := insert(tx, 1); err == nil { // message 2: duplicate key fails at execution
		t.Fatal("duplicate insert succeeded")
	}
	if err := store.RollbackToSavepoint(ctx, tx); err != nil {
		t.Fatalf("rollback after an execution error: %v", err)
	}
	step(true) // message 3 sends nothing and fails
	if err := store.RollbackToSavepoint(ctx, tx); err != nil {
		t.Fatalf("rollback of a message that sent nothing: %v", err)
	}
	step(true)
	if err := insert(tx, 4); err != nil { // message 4 commits
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 2 {
		t.Fatalf("%d rows committed, want 2 (messages 1 and 4)", n)
	}

	// A statement that fails to prepare fails its whole pipeline: the
	// savepoint is never confirmed, and rolling back must refuse rather
	// than undo message 5.
	tx2, err := store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx2.Rollback(ctx)
	tx = tx2
	step(false)
	if err := insert(tx, 5); err != nil {
		t.Fatal(err)
	}
	step(true)
	if _, err := tx.Exec(ctx, `SELEC $1`, 1); err == nil {
		t.Fatal("a statement that does not parse succeeded")
	}
	if err := store.RollbackToSavepoint(ctx, tx); !errors.Is(err, errSavepointNotCreated) {
		t.Fatalf("rollback to an unconfirmed savepoint = %v, want errSavepointNotCreated", err)
	}
}
