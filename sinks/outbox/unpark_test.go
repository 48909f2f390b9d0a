package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/sinks/outbox"
)

// The failing and parked rows are counted and grouped by destination and
// error; Parked lists the parked rows, Unpark puts the named ones back to
// pending with no attempt counted (and they are published again), and
// UnparkAll the rest.
func TestRelayUnpark(t *testing.T) {
	for _, d := range []string{"postgres", "sqlite"} {
		t.Run(d, func(t *testing.T) {
			ctx := context.Background()
			var broken atomic.Bool // the "missing" destination fails while set
			broken.Store(true)
			pub := &recorder{fail: func(m outbox.Message) error {
				switch {
				case m.Destination == "missing" && broken.Load():
					return outbox.NoDestination(errors.New("no such queue"))
				case m.Destination == "flaky":
					return errors.New("refused")
				}
				return nil
			}}
			// Rows are parked at their first failure by park, and wait an
			// hour after it with slow.
			parkCfg := testConfig()
			parkCfg.MaxAttempts = 1
			slowCfg := testConfig()
			slowCfg.InitialBackoff, slowCfg.MaxBackoff = time.Hour, time.Hour
			var park, slow *outbox.Relay
			var insert func(msgs ...outbox.Message)
			switch d {
			case "postgres":
				pool := newPool(t)
				park, _ = outbox.NewRelay(pool, pub, parkCfg)
				slow, _ = outbox.NewRelay(pool, pub, slowCfg)
				insert = func(msgs ...outbox.Message) { insertPG(t, pool, msgs...) }
			case "sqlite":
				db := newSQLite(t)
				park, _ = outbox.NewSQLiteRelay(db, pub, parkCfg)
				slow, _ = outbox.NewSQLiteRelay(db, pub, slowCfg)
				insert = func(msgs ...outbox.Message) { insertSQL(t, db, msgs...) }
			}
			insert(
				outbox.Message{ID: "p1", Destination: "missing", Key: "a"},
				outbox.Message{ID: "a2", Destination: "d", Key: "a"},
				outbox.Message{ID: "p2", Destination: "missing", Key: "b"},
			)
			drain(t, park)
			insert(outbox.Message{ID: "f1", Destination: "flaky", Key: "f"})
			if _, err := slow.RelayOnce(ctx); err != nil {
				t.Fatal(err)
			}
			c, err := slow.Counts(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if c.Parked != 2 || c.Pending != 1 || c.Failing != 1 || c.Sent != 1 {
				t.Fatalf("counts %+v, want 2 parked, 1 pending and failing, 1 sent", c)
			}
			groups, err := slow.Failures(ctx, 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(groups) != 2 {
				t.Fatalf("failures %+v, want 2 groups", groups)
			}
			if g := groups[0]; g.Destination != "missing" || g.Parked != 2 || g.Failing != 0 || g.LastID != "p2" || !strings.Contains(g.Error, "no such queue") {
				t.Fatalf("first group %+v, want the 2 rows parked for missing, p2 the newest", g)
			}
			if g := groups[1]; g.Destination != "flaky" || g.Parked != 0 || g.Failing != 1 || g.LastID != "f1" || g.Error != "refused" {
				t.Fatalf("second group %+v, want f1 failing", g)
			}

			parked, err := slow.Parked(ctx, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			if got := parkedIDs(parked); got != "[p1 p2]" || parked[0].Attempts != 1 || parked[0].Key != "a" || !strings.Contains(parked[0].LastError, "no such queue") || time.Since(parked[0].Created) > time.Hour {
				t.Fatalf("parked rows %+v, want p1 and p2", parked)
			}
			if parked, err = slow.Parked(ctx, []string{"p2", "a2", "nope"}, 0); err != nil || parkedIDs(parked) != "[p2]" {
				t.Fatalf("parked among p2, a2, nope: %+v, %v; want p2", parked, err)
			}
			if parked, err = slow.Parked(ctx, nil, 1); err != nil || parkedIDs(parked) != "[p1]" {
				t.Fatalf("one parked row: %+v, %v; want p1", parked, err)
			}

			broken.Store(false)
			if n, err := slow.Unpark(ctx, "p1", "a2", "nope"); err != nil || n != 1 {
				t.Fatalf("unpark p1, a2, nope = %d, %v; want 1", n, err)
			}
			if c, _ = slow.Counts(ctx); c.Parked != 1 || c.Pending != 2 || c.Failing != 1 {
				t.Fatalf("after unparking p1: counts %+v, want 1 parked, 2 pending, 1 of them failing (f1)", c)
			}
			if _, err := slow.RelayOnce(ctx); err != nil {
				t.Fatal(err)
			}
			if n, err := slow.Unpark(ctx); err != nil || n != 0 {
				t.Fatalf("unpark without ids = %d, %v; want 0", n, err)
			}
			if n, err := slow.UnparkAll(ctx); err != nil || n != 1 {
				t.Fatalf("unpark all = %d, %v; want 1", n, err)
			}
			if _, err := slow.RelayOnce(ctx); err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprint(pub.ids()); got != "[a2 p1 p2]" {
				t.Fatalf("published %s, want [a2 p1 p2]: the unparked rows went out again", got)
			}
			if c, _ = slow.Counts(ctx); c.Parked != 0 || c.Sent != 3 {
				t.Fatalf("counts %+v, want 0 parked, 3 sent", c)
			}
		})
	}
}

func parkedIDs(rows []outbox.ParkedRow) string {
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	return fmt.Sprint(ids)
}

// insertSQL commits msgs to the outbox of db.
func insertSQL(t *testing.T, db *sql.DB, msgs ...outbox.Message) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for _, m := range msgs {
		if _, err := outbox.PublishSQL(ctx, tx, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}
