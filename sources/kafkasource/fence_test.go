package kafkasource_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sources/kafkasource"
	"github.com/idemq/idemq/sources/sourcetest"
)

// A message waiting for an in-process retry when its generation ends is
// fetched again by its partition's owner in the new generation. The old
// generation's retry must then be dropped: before, both copies used up their
// attempts and both were dead-lettered (9 dead letters for 8 poison messages
// in chaos runs). Each source here retries a message once and dead-letters
// it on its second attempt; the dead-letter topic must hold one copy.
func TestRetryOfEndedGenerationIsDropped(t *testing.T) {
	t.Parallel() // its own topic, group and schema
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := newTopic(t, brokers, 1)
	group := topic + "-g"
	publish(t, brokers, topic, sourcetest.Outgoing{Key: "poison-1", Body: []byte("poison")})

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	const retryDelay = 8 * time.Second // longer than the rebalance below
	var mu sync.Mutex
	var log []string
	retried := make(chan struct{}, 4)
	work := func(name string, src *kafkasource.Source) {
		defer wg.Done()
		for ctx.Err() == nil {
			msgs, err := src.Receive(ctx, 10)
			if err != nil {
				continue
			}
			for _, m := range msgs {
				mu.Lock()
				log = append(log, name+" got "+m.ID+" attempt "+strconv.Itoa(m.Attempt))
				mu.Unlock()
				if m.Attempt < 2 {
					if err := src.Retry(ctx, m, retryDelay); err != nil {
						t.Errorf("%s: Retry: %v", name, err)
					}
					retried <- struct{}{}
					continue
				}
				reason := &consumer.DeadLetterError{Key: m.Key, Attempts: m.Attempt, Err: consumer.ErrMaxAttempts}
				if err := src.DeadLetter(ctx, m, reason); err != nil {
					t.Logf("%s: DeadLetter: %v", name, err)
				}
			}
		}
	}
	a := openSource(t, testConfig(t, brokers, topic, group))
	wg.Add(1)
	go work("a", a)
	select {
	case <-retried:
	case <-time.After(waitTimeout):
		t.Fatal("the first source did not receive the message")
	}
	// A second member joins: the generation ends while the message waits
	// for its retry, and the partition's new owner fetches it again.
	b := openSource(t, testConfig(t, brokers, topic, group))
	wg.Add(1)
	go work("b", b)

	deadline := time.Now().Add(3*retryDelay + 10*time.Second)
	for time.Now().Before(deadline) {
		if a.Stats().DeadLettered+b.Stats().DeadLettered >= 1 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Wait for the old generation's retry to come due and be dropped; had it
	// been handed out instead, its copy would be dead-lettered a second
	// time, which fails the test as soon as it is seen. The dead letter's
	// commit passes the dropped copy's offset.
	runtest.WaitFor(t, 3*retryDelay+waitTimeout, func() string {
		return fmt.Sprintf("the old generation's retry neither dropped nor dead-lettered again (a %+v, b %+v)", a.Stats(), b.Stats())
	}, func() bool {
		if n := a.Stats().DeadLettered + b.Stats().DeadLettered; n > 1 {
			t.Fatalf("%d dead letters for 1 poison message, want 1: the old generation's retry was handed out", n)
		}
		return a.Stats().StaleSettlesDropped >= 1
	})
	waitOffset(t, brokers, group, topic, 1)
	if n := a.Stats().StaleSettlesDropped; n != 1 {
		t.Errorf("the first source dropped %d stale settles, want 1 (its retry)", n)
	}
	cancel()
	wg.Wait()
	dead := readTopic(t, brokers, kafkasource.DeadLetterTopic(topic))
	mu.Lock()
	defer mu.Unlock()
	if len(dead) != 1 {
		t.Fatalf("%d dead letters for 1 poison message, want 1; deliveries: %v", len(dead), log)
	}
	t.Logf("deliveries: %v", log)
}
