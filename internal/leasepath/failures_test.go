package leasepath_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/internal/runtest"
)

// raisedAttempts is a source whose every delivery looks as if extra earlier
// deliveries had gone to consumers that crashed: its Attempt (the broker's
// delivery count) is extra higher.
type raisedAttempts struct {
	consumer.Source
	extra int
}

func (s raisedAttempts) Receive(ctx context.Context, max int) ([]*consumer.Message, error) {
	msgs, err := s.Source.Receive(ctx, max)
	for _, m := range msgs {
		m.Attempt += s.extra
	}
	return msgs, err
}

// The lease path counts failures in Redis: a message whose delivery count
// ten crashed consumers raised, and whose handler fails once, is retried and
// completed, and the count in Redis is one.
func TestLeasedCountsFailuresInRedis(t *testing.T) {
	store, rdb := newRedisStore(t)
	broker := memsource.New(memsource.Config{VisibilityTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { broker.Close() })
	broker.Publish("t", memsource.Outgoing{Key: "k1", Body: []byte("b")})
	var mu sync.Mutex
	calls := 0
	handler := func(context.Context, *consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if calls++; calls == 1 {
			return errors.New("downstream refused")
		}
		return nil
	}
	name := randomName("attempts")
	r, err := consumer.NewRunner(raisedAttempts{Source: broker.Source("t"), extra: 10},
		consumer.Leased(store, handler, consumer.LeaseOptions{}),
		consumer.Config{Name: name, Concurrency: 1,
			Retry: consumer.RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Millisecond, MaxBackoff: time.Second, Jitter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	runtest.RunUntil(t, func() bool { st := broker.Stats("t"); return st.Acks+st.DeadLettered > 0 }, r)
	if st := broker.Stats("t"); st.DeadLettered != 0 || st.Acks != 1 {
		t.Fatalf("dead-lettered %d, acked %d; want 0 and 1", st.DeadLettered, st.Acks)
	}
	n, err := rdb.HGet(context.Background(), store.FailuresKey(name, "k1"), "n").Int()
	if err != nil || n != 1 {
		t.Fatalf("failure count in Redis = %d, %v; want 1", n, err)
	}
}
