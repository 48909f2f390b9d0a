package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sinks/outbox"
)

// replyRow is an outbox row as a reply test checks it.
type replyRow struct {
	id, dest, routingKey, headers, body string
	state                               int
}

func replyRows(t *testing.T, pool *pgxpool.Pool) []replyRow {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id, destination, routing_key, headers, body, state FROM idemq_outbox ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (replyRow, error) {
		var x replyRow
		var body []byte
		err := r.Scan(&x.id, &x.dest, &x.routingKey, &x.headers, &body, &x.state)
		x.body = string(body)
		return x, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// request is a memsource message asking for a reply to replyTo.
func request(key, body, replyTo, corr string) memsource.Outgoing {
	h := map[string]string{}
	if replyTo != "" {
		h[consumer.HeaderReplyTo] = replyTo
	}
	if corr != "" {
		h[consumer.HeaderCorrelationID] = corr
	}
	return memsource.Outgoing{Key: key, Body: []byte(body), Headers: h}
}

// replier returns a runner named "replier" over src answering with
// "ok:"+body (failing for a body "fail", no result for "nil"), the Resender
// installed (logging to logger, if not nil), and its handler-run counter.
func replier(t *testing.T, pool *pgxpool.Pool, schema string, src consumer.Source, logger *slog.Logger) (*consumer.Runner, *atomic.Int64) {
	t.Helper()
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	resend, err := outbox.NewResender(pool, outbox.ResendConfig{Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	h := outbox.Reply(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) ([]byte, error) {
		runs.Add(1)
		switch string(msg.Body) {
		case "fail":
			return nil, consumer.Permanent(errors.New("refused"))
		case "nil":
			return nil, nil
		}
		return []byte("ok:" + string(msg.Body)), nil
	})
	r, err := consumer.NewRunner(src, consumer.Transactional(store, h),
		consumer.Config{Name: "replier", Retry: fastRetry, Hooks: []consumer.Hook{resend}})
	if err != nil {
		t.Fatal(err)
	}
	return r, &runs
}

func TestReply(t *testing.T) {
	t.Run("the reply commits with the effect", func(t *testing.T) {
		pool, schema := newPoolSchema(t)
		b := memsource.New(memsource.Config{VisibilityTimeout: time.Second})
		defer b.Close()
		b.Publish("requests",
			request("r-1", "a", "replies", "c-1"),
			request("r-2", "b", "", ""),              // asks for no reply
			request("r-3", "fail", "replies", "c-3")) // its handler fails: no reply
		r, _ := replier(t, pool, schema, b.Source("requests"), nil)
		runUntil(t, r, func(s consumer.Stats) bool { return s.Handled == 2 && s.DeadLettered == 1 })
		rows := replyRows(t, pool)
		want := replyRow{id: "replier:r-1" + outbox.ReplySuffix, dest: "replies", headers: `{"idemq-correlation-id":"c-1"}`, body: "ok:a"}
		if len(rows) != 1 || rows[0] != want {
			t.Fatalf("outbox rows %+v, want only %+v", rows, want)
		}
	})

	t.Run("a duplicate re-sends the stored reply with the same id", func(t *testing.T) {
		pool, schema := newPoolSchema(t)
		b := memsource.New(memsource.Config{VisibilityTimeout: time.Second})
		defer b.Close()
		b.Publish("requests", request("r-1", "a", "replies", "c-1"))
		r, runs := replier(t, pool, schema, b.Source("requests"), nil)
		runUntil(t, r, func(s consumer.Stats) bool { return s.Handled == 1 })
		// The relay sent the first reply.
		if _, err := pool.Exec(context.Background(), `UPDATE idemq_outbox SET state = 1, sent_at = now()`); err != nil {
			t.Fatal(err)
		}
		// The requester lost it and retries with a new correlation id.
		b.Publish("requests", request("r-1", "a", "replies", "c-2"))
		r, runs2 := replier(t, pool, schema, b.Source("requests"), nil)
		runUntil(t, r, func(s consumer.Stats) bool { return s.Duplicates == 1 })
		if n := runs.Load() + runs2.Load(); n != 1 {
			t.Fatalf("handler ran %d times, want 1", n)
		}
		rows := replyRows(t, pool)
		want := replyRow{id: "replier:r-1" + outbox.ReplySuffix, dest: "replies", headers: `{"idemq-correlation-id":"c-2"}`, body: "ok:a", state: 0}
		if len(rows) != 1 || rows[0] != want {
			t.Fatalf("outbox rows %+v, want only %+v (the first reply, pending again)", rows, want)
		}
	})

	t.Run("a duplicate asking for the reply elsewhere is refused", func(t *testing.T) {
		pool, schema := newPoolSchema(t)
		b := memsource.New(memsource.Config{VisibilityTimeout: time.Second})
		defer b.Close()
		b.Publish("requests", request("r-1", "a", "replies", "c-1"))
		r, _ := replier(t, pool, schema, b.Source("requests"), nil)
		runUntil(t, r, func(s consumer.Stats) bool { return s.Handled == 1 })
		first := replyRow{id: "replier:r-1" + outbox.ReplySuffix, dest: "replies", headers: `{"idemq-correlation-id":"c-1"}`, body: "ok:a", state: 0}
		if rows := replyRows(t, pool); len(rows) != 1 || rows[0] != first {
			t.Fatalf("outbox rows %+v, want only %+v", rows, first)
		}
		// The reply is still pending when a copy of the request (same key,
		// same payload) asks for it at another destination: the first
		// requester's reply must stay where it goes.
		for i, state := range []int{0, 1} {
			if _, err := pool.Exec(context.Background(), `UPDATE idemq_outbox SET state = $1`, state); err != nil {
				t.Fatal(err)
			}
			logs := testenv.NewLogRecorder()
			b.Publish("requests", request("r-1", "a", "elsewhere", fmt.Sprintf("c-x%d", i)))
			r, _ = replier(t, pool, schema, b.Source("requests"), logs.Logger())
			runUntil(t, r, func(s consumer.Stats) bool { return s.Duplicates == 1 })
			want := first
			want.state = state
			if rows := replyRows(t, pool); len(rows) != 1 || rows[0] != want {
				t.Fatalf("row in state %d: outbox rows %+v after a duplicate asking for the reply at %q, want only %+v (unchanged)", state, rows, "elsewhere", want)
			}
			if got := logs.Find("outbox: reply not re-sent"); len(got) != 1 || got[0].Level != slog.LevelWarn {
				t.Fatalf("row in state %d: refusal logged as %+v, want one WARN", state, got)
			}
		}
	})
	t.Run("a new request for an existing reply elsewhere is dead-lettered", func(t *testing.T) {
		pool, schema := newPoolSchema(t)
		b := memsource.New(memsource.Config{VisibilityTimeout: time.Second})
		defer b.Close()
		b.Publish("requests", request("r-1", "a", "replies", "c-1"))
		r, _ := replier(t, pool, schema, b.Source("requests"), nil)
		runUntil(t, r, func(s consumer.Stats) bool { return s.Handled == 1 })
		// The request's record expired while its reply's row stayed: a new
		// copy of the request runs the handler and asks for the reply
		// elsewhere.
		if _, err := pool.Exec(context.Background(), `DELETE FROM processed_messages`); err != nil {
			t.Fatal(err)
		}
		b.Publish("requests", request("r-1", "a", "elsewhere", "c-2"))
		r, runs := replier(t, pool, schema, b.Source("requests"), nil)
		runUntil(t, r, func(s consumer.Stats) bool { return s.DeadLettered == 1 })
		if runs.Load() != 1 || r.Stats().Handled != 0 {
			t.Fatalf("handler ran %d times, %d handled; want 1 run, dead-lettered", runs.Load(), r.Stats().Handled)
		}
		want := replyRow{id: "replier:r-1" + outbox.ReplySuffix, dest: "replies", headers: `{"idemq-correlation-id":"c-1"}`, body: "ok:a"}
		if rows := replyRows(t, pool); len(rows) != 1 || rows[0] != want {
			t.Fatalf("outbox rows %+v, want only %+v (unchanged)", rows, want)
		}
	})
	t.Run("a duplicate without a stored result re-arms the reply but never invents one", func(t *testing.T) {
		pool, schema := newPoolSchema(t)
		b := memsource.New(memsource.Config{VisibilityTimeout: time.Second})
		defer b.Close()
		// "nil" answers with no result: the record keeps none.
		b.Publish("requests", request("r-1", "nil", "replies", "c-1"))
		r, _ := replier(t, pool, schema, b.Source("requests"), nil)
		runUntil(t, r, func(s consumer.Stats) bool { return s.Handled == 1 })
		if rows := replyRows(t, pool); len(rows) != 1 || rows[0].body != "" {
			t.Fatalf("outbox rows %+v, want one empty reply", rows)
		}
		// The relay sent it and its cleanup deleted the row.
		if _, err := pool.Exec(context.Background(), `DELETE FROM idemq_outbox`); err != nil {
			t.Fatal(err)
		}
		b.Publish("requests", request("r-1", "nil", "replies", "c-2"))
		r, _ = replier(t, pool, schema, b.Source("requests"), nil)
		runUntil(t, r, func(s consumer.Stats) bool { return s.Duplicates == 1 })
		if rows := replyRows(t, pool); len(rows) != 0 {
			t.Fatalf("outbox rows %+v after the duplicate, want none: a record without a result says nothing of the reply", rows)
		}
	})
}

func TestNewResenderConfig(t *testing.T) {
	if _, err := outbox.NewResender(nil, outbox.ResendConfig{}); !errors.Is(err, idemq.ErrInvalidConfig) {
		t.Fatalf("nil db: %v, want ErrInvalidConfig", err)
	}
	if _, err := outbox.NewResender((*pgxpool.Pool)(nil), outbox.ResendConfig{Timeout: -1}); !errors.Is(err, idemq.ErrInvalidConfig) {
		t.Fatalf("negative Timeout: %v, want ErrInvalidConfig", err)
	}
}

// A runner with a Resender refuses to start while the outbox table is
// missing, naming the migration that creates it.
func TestResenderChecksOutboxTable(t *testing.T) {
	pool, schema := newPoolSchema(t)
	if _, err := pool.Exec(context.Background(), `DROP TABLE idemq_outbox`); err != nil {
		t.Fatal(err)
	}
	b := memsource.New(memsource.Config{})
	defer b.Close()
	r, _ := replier(t, pool, schema, b.Source("requests"), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := r.Run(ctx)
	if !errors.Is(err, dedup.ErrNotMigrated) || !strings.Contains(err.Error(), "idemq migrate --outbox") {
		t.Fatalf("Run = %v; want dedup.ErrNotMigrated naming idemq migrate --outbox", err)
	}
}
