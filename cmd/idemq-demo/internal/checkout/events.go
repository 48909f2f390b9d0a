package checkout

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/migrate"
	"github.com/idemq/idemq/sinks/outbox"
)

// EnableEvents makes the charges of s publish an "order charged" event to
// destination through the transactional outbox (sinks/outbox): the event
// is written with outbox.Publish in the charge's own transaction, so it
// exists if and only if the charge committed, and its stable id (the
// order's idempotency key scoped by the consumer's name, "/0") is the same
// on every run of the handler. The body is the order's JSON; the partition
// key is its account. EnableEvents creates the outbox table; an
// outbox.Relay publishes the events. Call it before the worker starts.
func EnableEvents(ctx context.Context, s Store, destination string) error {
	switch s := s.(type) {
	case *SQLiteStore:
		m, err := migrate.NewSQL(s.DB, migrate.Config{Line: migrate.Outbox, Dialect: migrate.SQLite})
		if err == nil {
			_, err = m.Migrate(ctx)
		}
		if err != nil {
			return fmt.Errorf("checkout: create the outbox table: %w", err)
		}
		s.Events = destination
	case *PostgresStore:
		m, err := migrate.NewPgx(s.Pool, migrate.Config{Line: migrate.Outbox}) // in the schema: the pool's search_path
		if err == nil {
			_, err = m.Migrate(ctx)
		}
		if err != nil {
			return fmt.Errorf("checkout: create the outbox table: %w", err)
		}
		s.Events = destination
	default:
		return fmt.Errorf("checkout: no events on a %T", s)
	}
	return nil
}

// withEvents returns h followed, when destination is set, by the publish
// of the order's "charged" event in the same transaction.
func withEvents[Tx any](h consumer.TxHandler[Tx], destination string) consumer.TxHandler[Tx] {
	if destination == "" {
		return h
	}
	return func(ctx context.Context, tx Tx, m *consumer.Message) error {
		if err := h(ctx, tx, m); err != nil {
			return err
		}
		var o Order
		if err := json.Unmarshal(m.Body, &o); err != nil { // h accepted it: cannot fail
			return consumer.Permanent(err)
		}
		msg := outbox.Message{Destination: destination, Key: o.Account, Body: m.Body}
		var err error
		switch tx := any(tx).(type) {
		case outbox.PgxQuerier:
			_, err = outbox.Publish(ctx, tx, msg)
		case outbox.SQLQuerier:
			_, err = outbox.PublishSQL(ctx, tx, msg)
		default:
			err = fmt.Errorf("checkout: no events in a %T", tx)
		}
		return err
	}
}
