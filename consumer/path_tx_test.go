package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
)

// quickRetry is a retry policy for tests: maxAttempts attempts, short backoff.
func quickRetry(maxAttempts int) consumer.RetryPolicy {
	return consumer.RetryPolicy{MaxAttempts: maxAttempts, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}
}

// A handler's own failure is a counted attempt, whatever its type: its
// deadline, a failed HTTP call, a DNS failure, a truncated body. Only the
// store's typed database errors are infrastructure.
func TestHandlerErrorsAreCountedAttempts(t *testing.T) {
	for name, hErr := range map[string]func(ctx context.Context, tx pgx.Tx) error{
		"deadline": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT pg_sleep(10)`)
			return err
		},
		"url error": func(context.Context, pgx.Tx) error {
			return &url.Error{Op: "Post", URL: "http://127.0.0.1:1/hook", Err: &net.OpError{Op: "dial", Err: errors.New("connection refused")}}
		},
		"dns error": func(context.Context, pgx.Tx) error {
			return fmt.Errorf("lookup: %w", &net.DNSError{Err: "timeout", Name: "example.invalid", IsTimeout: true})
		},
		"unexpected EOF": func(context.Context, pgx.Tx) error {
			return fmt.Errorf("decode: %w", io.ErrUnexpectedEOF)
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			f.publish("k")
			h := func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
				if err := f.handler(nil)(ctx, tx, msg); err != nil {
					return err
				}
				return hErr(ctx, tx)
			}
			r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, h),
				consumer.Config{HandlerTimeout: 100 * time.Millisecond, Retry: quickRetry(2)})
			f.settled()
			r.stop(t)
			dl := f.broker.DeadLetters(f.topic)
			if len(dl) != 1 || !errors.Is(dl[0].Err, consumer.ErrMaxAttempts) {
				t.Fatalf("dead letters = %+v, want k after its attempts", dl)
			}
			if f.calls("k") != 2 {
				t.Fatalf("handler ran %d times, want 2 (MaxAttempts)", f.calls("k"))
			}
			f.requireOnce()
			if _, err := f.store.Inspect(context.Background(), "test", "k"); !errors.Is(err, dedup.ErrNotFound) {
				t.Fatalf("record of the failed key: %v, want ErrNotFound", err)
			}
		})
	}
}

// Permanent wins over any classification: dead-lettered after one call.
func TestPermanentWinsOverTransient(t *testing.T) {
	for name, err := range map[string]error{
		"dns error":   &net.DNSError{Err: "timeout", Name: "example.invalid", IsTimeout: true},
		"deadlock":    &pgconn.PgError{Code: "40P01", Message: "deadlock detected"},
		"lost server": &pgconn.PgError{Code: "57P01", Message: "terminating connection"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			f.publish("k")
			h := func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
				f.mu.Lock()
				f.runs["k"]++
				f.mu.Unlock()
				return consumer.Permanent(err)
			}
			r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, h), consumer.Config{Retry: quickRetry(5)})
			f.settled()
			r.stop(t)
			dl := f.broker.DeadLetters(f.topic)
			if len(dl) != 1 || f.calls("k") != 1 {
				t.Fatalf("%d calls, dead letters %+v: want 1 call and 1 dead letter", f.calls("k"), dl)
			}
		})
	}
}

// A handler's serialization failure or deadlock is the database's, not the
// message's: retried without counting, never dead-lettered.
func TestHandlerSerializationFailureIsNotCounted(t *testing.T) {
	for _, code := range []string{"40001", "40P01"} {
		t.Run(code, func(t *testing.T) {
			f := newFixture(t)
			f.publish("busy")
			fail := func(msg *consumer.Message, call int) error {
				if call <= 4 {
					return fmt.Errorf("update: %w", &pgconn.PgError{Code: code, Message: "could not serialize"})
				}
				return nil
			}
			r := f.start(f.broker.Source(f.topic), consumer.Transactional(f.store, f.handler(fail)), consumer.Config{Retry: quickRetry(2)})
			f.settled()
			r.stop(t)
			f.requireOnce("busy")
			if dl := f.broker.DeadLetters(f.topic); len(dl) != 0 || f.calls("busy") != 5 {
				t.Fatalf("%d calls, dead letters %+v: want 5 calls, none dead-lettered", f.calls("busy"), dl)
			}
		})
	}
}
