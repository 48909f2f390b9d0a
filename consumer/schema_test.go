package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
)

// Run refuses to start on a store whose migrations were not applied, with
// an error that names the remedy, before it logs "consuming" or receives
// anything.
func TestRunRefusesUnmigratedStore(t *testing.T) {
	pool, schema := testenv.SchemaPool(t)
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	b := memBroker(t, memsource.Config{})
	b.Publish("orders", memsource.Outgoing{Key: "k1"})
	var logs runtest.SyncBuffer
	r := newRunner(t, b.Source("orders"),
		consumer.Transactional(store, func(context.Context, pgx.Tx, *consumer.Message) error { return nil }),
		consumer.Config{Name: "billing", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = r.Run(ctx)
	var se *dedup.SchemaError
	if !errors.Is(err, dedup.ErrNotMigrated) || !errors.As(err, &se) {
		t.Fatalf("Run = %v; want a *dedup.SchemaError", err)
	}
	for _, want := range []string{"Migrate", "idemq migrate", schema + ".processed_messages"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Run's error %q lacks %q", err, want)
		}
	}
	if strings.Contains(logs.String(), "consuming") {
		t.Errorf("Run logged its start line before refusing:\n%s", logs.String())
	}
	if st := b.Stats("orders"); st.InFlight != 0 || st.Ready != 1 {
		t.Errorf("broker stats = %+v; want the message untouched", st)
	}
}
