package sqssource_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/runtest"
)

// The source reports the queue's MessageRetentionPeriod, and the Runner
// refuses a dedup retention below it: a queue keeping messages 4 days (SQS's
// default) with a store forgetting them after 72 h is refused, with 8 days
// (dedup.DefaultRetention) it runs.
func TestRetentionGuard(t *testing.T) {
	needServices(t)
	c := sqsClient(t)
	ctx := testContext(t, 30*time.Second)
	name := runtest.UniqueName(t, "")
	dlq := createQueue(ctx, t, c, name+"-dlq", nil)
	q := createQueue(ctx, t, c, name, map[string]string{
		string(types.QueueAttributeNameMessageRetentionPeriod): strconv.Itoa(int((4 * 24 * time.Hour).Seconds())),
	})
	cfg := sourceConfig(t, testQueue{URL: q, DLQURL: dlq})
	src := newSource(t, cfg)
	horizon, err := src.RedeliveryHorizon(ctx)
	if err != nil || horizon != 96*time.Hour {
		t.Fatalf("RedeliveryHorizon = %v, %v; want 96h", horizon, err)
	}

	db := newDatabase(t)
	for _, tc := range []struct {
		retention time.Duration
		refused   bool
	}{{72 * time.Hour, true}, {dedup.DefaultRetention, false}} {
		store, err := pgdedup.New(db.Pool, pgdedup.Config{Schema: db.Schema, Retention: tc.retention})
		if err != nil {
			t.Fatal(err)
		}
		r, err := consumer.NewRunner(src, consumer.Transactional(store, func(context.Context, pgx.Tx, *consumer.Message) error { return nil }),
			consumer.Config{Name: "retention"})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = r.Run(rctx)
		cancel()
		if got := errors.Is(err, idemq.ErrInvalidConfig); got != tc.refused {
			t.Fatalf("retention %s: Run = %v, want refused %v", tc.retention, err, tc.refused)
		}
		t.Logf("retention %s: Run = %v", tc.retention, err)
	}
}
