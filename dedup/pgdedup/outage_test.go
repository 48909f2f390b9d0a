package pgdedup_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/testenv"
)

// A pipelined call that fails because the database is unreachable reports
// its error once: the batch's Close returns the error its first result
// already did, and joining both printed every outage error twice.
func TestUnreachableDatabaseErrorIsNotRepeated(t *testing.T) {
	store, _ := newStore(t, pgdedup.Config{})
	dbURL, proxy := testenv.ProxyURL(t, testenv.DatabaseURL(t))
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	ctx := testCtx(t)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := pgdedup.New(pool, pgdedup.Config{Schema: store.Config().Schema})
	if err != nil {
		t.Fatal(err)
	}
	recs := []dedup.Record{rec("k1", "a")}

	// The connection dies while the transaction is open: CommitChain.
	tx, _, err := s.Driver().BeginClaim(ctx, "scope", recs)
	if err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	_, _, err = s.Driver().CommitChain(ctx, tx, "scope", []dedup.Record{rec("k2", "b")})
	_ = tx.Rollback(context.Background())
	wantOnce(t, "CommitChain", err)

	// No connection at all: BeginClaim.
	_, _, err = s.Driver().BeginClaim(ctx, "scope", recs)
	wantOnce(t, "BeginClaim", err)
}

// wantOnce fails unless err is set and no line of its text repeats: an
// error joined with itself prints the same text on two lines.
func wantOnce(t *testing.T, call string, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s through a cut connection: no error", call)
	}
	lines := strings.Split(err.Error(), "\n")
	seen := map[string]bool{}
	for _, l := range lines {
		if seen[l] {
			t.Fatalf("%s: the error repeats %q:\n%v", call, l, err)
		}
		seen[l] = true
	}
}
