package consumer_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/internal/testenv"
)

// A Concurrency the store's connection pool cannot serve leaves a handler
// that queries outside its transaction waiting for ever: NewRunner refuses
// it, and an unset Concurrency is lowered to fit the pool.
func TestConcurrencyMustFitThePool(t *testing.T) {
	url := testenv.DatabaseURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 3
	pool, err := pgxpool.NewWithConfig(testCtx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	testenv.ClosePoolAtCleanup(t, pool)
	pg, err := pgdedup.New(pool, pgdedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(3)
	sq, err := sqldedup.New(db, sqldedup.Config{Dialect: sqldedup.Postgres})
	if err != nil {
		t.Fatal(err)
	}
	b := memBroker(t, memsource.Config{})
	paths := map[string]consumer.Path{
		"pgxpool":      consumer.Transactional(pg, func(context.Context, pgx.Tx, *consumer.Message) error { return nil }),
		"database/sql": consumer.Transactional(sq, func(context.Context, *sql.Tx, *consumer.Message) error { return nil }),
	}
	for name, path := range paths {
		t.Run(name, func(t *testing.T) {
			_, err := consumer.NewRunner(b.Source("t"), path, consumer.Config{Name: "pool", Concurrency: 3})
			var ce *idemq.ConfigError
			if !errors.As(err, &ce) || ce.Field != "Concurrency" || !strings.Contains(err.Error(), "at least 4 connections") ||
				!strings.Contains(err.Error(), "has 3") {
				t.Fatalf("NewRunner with Concurrency 3 on a pool of 3 = %v, want a *idemq.ConfigError naming both numbers", err)
			}
			r, err := consumer.NewRunner(b.Source("t"), path, consumer.Config{Name: "pool", Concurrency: 2})
			if err != nil {
				t.Fatalf("Concurrency 2 on a pool of 3: %v", err)
			}
			_ = r
			r, err = consumer.NewRunner(b.Source("t"), path, consumer.Config{Name: "pool"})
			if err != nil || r.Config().Concurrency != 2 {
				t.Fatalf("default Concurrency on a pool of 3: %v, Concurrency %d; want 2", err, r.Config().Concurrency)
			}
		})
	}
}

// A store whose New failed and whose error was ignored is a typed nil: the
// path's interface holds a nil pointer. NewRunner reports it as a
// *idemq.ConfigError instead of panicking (pgdedup). The lease store's case
// (redisdedup) is in internal/leasepath, which may import go-redis.
func TestTypedNilStoresAreConfigErrors(t *testing.T) {
	src := memsource.New(memsource.Config{}).Source("t")
	paths := map[string]consumer.Path{
		"pgdedup":  consumer.Transactional((*pgdedup.Store)(nil), func(context.Context, pgx.Tx, *consumer.Message) error { return nil }),
		"sqldedup": consumer.Transactional((*sqldedup.Store)(nil), func(context.Context, *sql.Tx, *consumer.Message) error { return nil }),
	}
	for name, p := range paths {
		t.Run(name, func(t *testing.T) {
			var ce *idemq.ConfigError
			defer func() {
				if v := recover(); v != nil {
					t.Fatalf("NewRunner with a nil *%s.Store panicked: %v", name, v)
				}
			}()
			if _, err := consumer.NewRunner(src, p, consumer.Config{Name: "x"}); !errors.As(err, &ce) {
				t.Fatalf("NewRunner with a nil *%s.Store = %v, want a *idemq.ConfigError", name, err)
			}
		})
	}
}
