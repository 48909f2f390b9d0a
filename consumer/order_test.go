package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
)

// Order holds across batches: while a message of a partition key is handed
// back for a retry, the later messages of that key that the runner already
// received, in a later Receive and so a later batch, must not commit ahead of
// it. The first message's failure is scripted to happen only once the later
// messages are in the runner's hands, so the test does not depend on timing:
// without a hold across batches, the later batch commits before the retry
// comes back, every time.
func TestPartitionOrderHeldAcrossBatches(t *testing.T) {
	for _, tc := range []struct {
		name string
		// fail returns the failure of the first delivery of p2.
		fail  func() error
		batch bool // a TransactionalBatch handler (bisects a plain error)
	}{
		{name: "handler error", fail: func() error { return errors.New("fails once") }},
		{name: "infrastructure retry", fail: func() error {
			return &pgconn.PgError{Code: "40001", Message: "could not serialize access"}
		}},
		{name: "bisect", batch: true, fail: func() error { return errors.New("one of these failed") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.visibility(10 * time.Second) // no redelivery by timeout on a loaded machine
			publish := func(from, to int) {
				for i := from; i < to; i++ {
					f.broker.Publish(f.topic, memsource.Outgoing{Key: fmt.Sprintf("p%d", i), Body: []byte(fmt.Sprint(i)), PartitionKey: "acct-1"})
				}
			}
			publish(0, 3)
			// laterInHand publishes p3..p5 and waits until the runner has
			// received them, while p2's first delivery is failing.
			var once sync.Once
			laterInHand := func() error {
				var err error
				once.Do(func() {
					publish(3, 6)
					deadline := time.Now().Add(10 * time.Second)
					for f.broker.Stats(f.topic).Deliveries < 6 {
						if time.Now().After(deadline) {
							err = errors.New("the runner did not receive p3..p5 within 10s")
							return
						}
						time.Sleep(2 * time.Millisecond)
					}
				})
				return err
			}
			var path consumer.Path
			if tc.batch {
				path = consumer.TransactionalBatch(f.store, func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
					failing := false
					for _, m := range msgs {
						if _, err := tx.Exec(ctx, `INSERT INTO `+f.table+` (key, body) VALUES ($1, $2)`, m.Key, string(m.Body)); err != nil {
							return err
						}
						failing = failing || (m.Key == "p2" && m.Attempt == 1)
					}
					if !failing {
						return nil
					}
					if err := laterInHand(); err != nil {
						return consumer.Permanent(err)
					}
					return tc.fail()
				})
			} else {
				path = consumer.Transactional(f.store, f.handler(func(msg *consumer.Message, call int) error {
					if msg.Key != "p2" || call != 1 {
						return nil
					}
					if err := laterInHand(); err != nil {
						return consumer.Permanent(err)
					}
					return tc.fail()
				}))
			}
			r := f.start(f.broker.Source(f.topic), path, consumer.Config{Concurrency: 1, BatchSize: 3})
			f.settled()
			r.stop()
			if dl := f.broker.DeadLetters(f.topic); len(dl) != 0 {
				t.Fatalf("dead letters: %+v", dl)
			}
			rows, err := f.pool.Query(context.Background(), `SELECT body FROM `+f.table+` ORDER BY id`)
			if err != nil {
				t.Fatal(err)
			}
			bodies, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(bodies, ","); got != "0,1,2,3,4,5" {
				t.Fatalf("committed in order %s, want 0,1,2,3,4,5: a later batch overtook p2 of the same partition", got)
			}
			if !tc.batch {
				for _, k := range []string{"p3", "p4", "p5"} {
					if n := f.calls(k); n != 1 {
						t.Errorf("%s ran %d times: held behind p2, it must run once, after p2", k, n)
					}
				}
			}
		})
	}
}
