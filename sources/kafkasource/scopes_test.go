package kafkasource_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/sourcetest"
)

// Several consumers share one dedup table, each under its own scope (its
// consumer.Config.Name): four scopes, each a consumer group of two competing
// workers, read one topic of 2,200 messages (200 of them a producer's
// re-sends, each right after its original). Each scope applies every message exactly once, independently
// of the others; one scope's short retention and a purge in one scope touch
// no other scope's records.
func TestScopesShareOneTable(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	db := newTestDB(t)
	topic := newTopic(t, brokers, 4)
	const n = 2000
	// Every tenth message is sent twice in a row, as a producer retrying a
	// send does: the copy follows the original on its partition, well inside
	// scope d's short retention.
	var msgs []sourcetest.Outgoing
	for i, m := range keyed("scoped", n, 0) {
		msgs = append(msgs, m)
		if i%10 == 0 {
			msgs = append(msgs, m)
		}
	}
	publish(t, brokers, topic, msgs...)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	effects := pgx.Identifier{db.schema, "scoped_effects"}.Sanitize()
	if _, err := db.pool.Exec(ctx, `CREATE TABLE `+effects+` (scope text NOT NULL, key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	// Scope "d" keeps its records 20 s (a store of its own on the same
	// table): short enough to wait out, long enough to outlast the
	// redeliveries of the group's first rebalance on a loaded machine (at
	// 5 s, scope d applied late redeliveries a second time).
	const shortRetention = 20 * time.Second
	short, err := pgdedup.New(db.pool, pgdedup.Config{Schema: db.schema, Retention: shortRetention})
	if err != nil {
		t.Fatal(err)
	}
	scopes := []string{"scope-a", "scope-b", "scope-c", "scope-d"}
	for _, scope := range scopes {
		store, allowShort := db.store, false
		if scope == "scope-d" {
			store, allowShort = short, true
		}
		path := consumer.Transactional(store, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (scope, key) VALUES ($1, $2)`, scope, m.Key)
			return err
		})
		group := runtest.UniqueName(t, "g-"+scope)
		for range 2 {
			src := openSource(t, testConfig(t, brokers, topic, group))
			startWorker(t, src, path, consumer.Config{Name: scope, Concurrency: 2, BatchSize: 10, AllowShortRetention: allowShort, Logger: runtest.Logger(t)})
		}
	}

	counts := func(query string) map[string][2]int {
		rows, err := db.pool.Query(ctx, query)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][2]int{}
		for rows.Next() {
			var scope string
			var a, b int
			if err := rows.Scan(&scope, &a, &b); err != nil {
				t.Fatal(err)
			}
			out[scope] = [2]int{a, b}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	perScope := `SELECT scope, count(*), count(DISTINCT key) FROM ` + effects + ` GROUP BY scope`
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got, done := counts(perScope), true
		for _, s := range scopes {
			done = done && got[s][1] == n
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("effects per scope (rows, keys) %v, want %d keys in each", got, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, s := range scopes {
		if got := counts(perScope)[s]; got != [2]int{n, n} {
			t.Errorf("scope %s: %d effect rows for %d keys, want %d of each", s, got[0], got[1], n)
		}
	}

	records := `SELECT scope, count(*), 0 FROM ` + pgx.Identifier{db.schema, "processed_messages"}.Sanitize() + ` GROUP BY scope`
	before := counts(records)
	// Scope d's records expire; its janitor deletes them and nothing else.
	unexpired := `SELECT count(*) FROM ` + pgx.Identifier{db.schema, "processed_messages"}.Sanitize() + ` WHERE scope = 'scope-d' AND expires_at > now()`
	for waitUntil := time.Now().Add(shortRetention + 10*time.Second); ; time.Sleep(250 * time.Millisecond) {
		var left int
		if err := db.pool.QueryRow(ctx, unexpired).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		if time.Now().After(waitUntil) {
			t.Fatalf("%d of scope d's records have not expired %v after the last effect", left, shortRetention+10*time.Second)
		}
	}
	deleted, err := short.Cleanup(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A purge in scope a removes that scope's record of one key only.
	key := fmt.Sprintf("scoped-%05d", 7)
	if ok, err := db.store.Purge(ctx, "scope-a", key); err != nil || !ok {
		t.Fatalf("purge: %v, %v", ok, err)
	}
	after := counts(records)
	t.Logf("records per scope before %v, after the cleanup (%d deleted) and the purge %v", before, deleted, after)
	for _, s := range scopes {
		want := before[s][0]
		switch s {
		case "scope-a":
			want--
		case "scope-d":
			want = 0
		}
		if after[s][0] != want {
			t.Errorf("scope %s: %d records after the cleanup and the purge, want %d", s, after[s][0], want)
		}
	}
	if before["scope-a"][0] != n || deleted != int64(before["scope-d"][0]) {
		t.Errorf("before: %v; cleanup deleted %d, want scope d's %d", before, deleted, before["scope-d"][0])
	}
}
