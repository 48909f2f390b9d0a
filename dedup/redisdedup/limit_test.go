package redisdedup_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisdedup"
)

// TestResultLimit: the store's result limit is the runner's unless lowered,
// and a result over a lowered limit fails with the typed error the runner
// dead-letters (dedup.ErrResultTooLarge), storing nothing.
func TestResultLimit(t *testing.T) {
	t.Run("the runner's by default", func(t *testing.T) {
		runner := consumer.Config{}.WithDefaults().MaxResultBytes
		if got := (redisdedup.Config{}).WithDefaults().MaxResultBytes; got != runner {
			t.Errorf("default MaxResultBytes = %d, want the runner's default (%d)", got, runner)
		}
		s, _ := newStore(t, redisdedup.Config{})
		ctx := testContext(t)
		scope, h, tok := unique("limit"), dedup.HashPayload([]byte("x")), token()
		if _, err := s.Claim(ctx, scope, dedup.Record{Key: "k", PayloadHash: h}, tok, time.Minute); err != nil {
			t.Fatal(err)
		}
		result := bytes.Repeat([]byte{'r'}, runner) // the largest the runner passes on
		if err := s.CompleteWithResult(ctx, scope, "k", tok, time.Hour, result); err != nil {
			t.Fatalf("CompleteWithResult of %d bytes: %v", len(result), err)
		}
		if e, err := s.Inspect(ctx, scope, "k"); err != nil || !bytes.Equal(e.Result, result) {
			t.Fatalf("Inspect: result of %d bytes, %v; want the %d stored", len(e.Result), err, len(result))
		}
	})

	t.Run("a lower limit is typed", func(t *testing.T) {
		s, _ := newStore(t, redisdedup.Config{MaxResultBytes: 16})
		ctx := testContext(t)
		scope, h, tok := unique("limit"), dedup.HashPayload([]byte("x")), token()
		if _, err := s.Claim(ctx, scope, dedup.Record{Key: "k", PayloadHash: h}, tok, time.Minute); err != nil {
			t.Fatal(err)
		}
		err := s.CompleteWithResult(ctx, scope, "k", tok, time.Hour, make([]byte, 17))
		if !errors.Is(err, dedup.ErrResultTooLarge) || !errors.Is(err, consumer.ErrResultTooLarge) {
			t.Fatalf("17 bytes over a limit of 16: err = %v, want one matching dedup.ErrResultTooLarge", err)
		}
		if e, err := s.Inspect(ctx, scope, "k"); err != nil || !e.InProgress {
			t.Fatalf("after the refused result: %+v, %v; want the lease still held, nothing stored", e, err)
		}
		if err := s.Complete(ctx, scope, "k", tok, time.Hour); err != nil {
			t.Fatalf("Complete without the result: %v", err)
		}
	})
}
