package sqldedup_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/sqldedup"
)

// A worker on SQLite: the handler writes its ledger row through the *sql.Tx
// that also records the message, so a redelivered order is not charged
// twice.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "sqldedup-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	db, err := sqldedup.OpenSQLite(ctx, filepath.Join(dir, "shop.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := sqldedup.New(db, sqldedup.Config{Dialect: sqldedup.SQLite})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE ledger (order_id TEXT NOT NULL, amount INTEGER NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	type Order struct {
		ID     string `json:"id"`
		Amount int64  `json:"amount"`
	}
	charge := consumer.TxJSON(func(ctx context.Context, tx *sql.Tx, _ *consumer.Message, o Order) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO ledger (order_id, amount) VALUES (?, ?)`, o.ID, o.Amount)
		return err
	})

	broker := memsource.New(memsource.Config{})
	for _, body := range []string{
		`{"id":"o-1","amount":10}`,
		`{"id":"o-2","amount":20}`,
		`{"id":"o-1","amount":10}`, // the producer sent o-1 twice
		`{"id":"o-3","amount":30}`,
	} {
		var o Order
		_ = json.Unmarshal([]byte(body), &o)
		broker.Publish("orders", memsource.Outgoing{Key: o.ID, Body: []byte(body)})
	}
	src := broker.Source("orders")
	defer src.Close()
	runner, err := consumer.NewRunner(src, consumer.Transactional(store, charge), consumer.Config{Name: "checkout"})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithTimeout(ctx, 30*time.Second)
	go func() {
		for broker.Stats("orders").Pending > 0 && runCtx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
		stop()
	}()
	if err := runner.Run(runCtx); err != nil {
		log.Fatal(err)
	}

	var rows, total int64
	if err := db.QueryRowContext(ctx, `SELECT count(*), sum(amount) FROM ledger`).Scan(&rows, &total); err != nil {
		log.Fatal(err)
	}
	st := runner.Stats()
	fmt.Printf("ledger: %d rows, total %d; handled %d, duplicates %d\n", rows, total, st.Handled, st.Duplicates)
	// Output: ledger: 3 rows, total 60; handled 3, duplicates 1
}
