package kafkasource_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/internal/runtest"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/internal/testenv/brokerenv"
	"github.com/idemq/idemq/sources/kafkasource"
	"github.com/idemq/idemq/sources/sourcetest"
)

// A topic that does not exist makes Receive fail with ErrTopicNotFound
// (again every few seconds while it is missing: on brokers that create
// topics on first use, like the test broker, the group creates it soon);
// once it exists, messages flow to the group that joined before it.
func TestReceiveMissingTopic(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	topic := runtest.UniqueName(t, "idemq-missing")
	brokerenv.DeleteTopicsAtCleanup(t, brokers, topic, kafkasource.DeadLetterTopic(topic))
	src := openSource(t, testConfig(t, brokers, topic, runtest.UniqueName(t, "g")))
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err := src.Receive(rctx, 10)
	rcancel()
	if !errors.Is(err, kafkasource.ErrTopicNotFound) {
		t.Fatalf("Receive on a missing topic: %v, want ErrTopicNotFound", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafkasource.CreateTopics(ctx, nil, brokers, kafkasource.TopicSpec{Name: topic}, kafkasource.TopicSpec{Name: kafkasource.DeadLetterTopic(topic)}); err != nil {
		t.Fatal(err)
	}
	publish(t, brokers, topic, sourcetest.Outgoing{Key: "k1", Body: []byte("x")})
	deadline := time.Now().Add(60 * time.Second)
	for {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		msgs, err := src.Receive(rctx, 10)
		rcancel()
		if err == nil && len(msgs) > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no message after the topic was created; last error %v", err)
		}
	}
}

// Close releases every connection the source opened, including the one
// New's lookup of missing topics opens: a source made and closed over and
// over (a worker restarting its consumer, a test suite) leaves nothing open.
func TestCloseReleasesConnections(t *testing.T) {
	skipShort(t)
	brokers := testenv.KafkaBrokers(t)
	var open, dialed atomic.Int64
	d := &net.Dialer{Timeout: 10 * time.Second}
	dialer := &kafka.Dialer{Timeout: 10 * time.Second, DialFunc: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		open.Add(1)
		dialed.Add(1)
		return &countedConn{Conn: c, open: &open}, nil
	}}
	for _, missing := range []bool{false, true} {
		topic := runtest.UniqueName(t, "idemq-missing")
		if missing {
			brokerenv.DeleteTopicsAtCleanup(t, brokers, topic, kafkasource.DeadLetterTopic(topic))
		} else {
			topic = newTopic(t, brokers, 1)
		}
		for range 3 {
			cfg := testConfig(t, brokers, topic, runtest.UniqueName(t, "g"))
			cfg.Dialer = dialer
			src := openSource(t, cfg)
			if err := src.Close(); err != nil {
				t.Fatal(err)
			}
		}
		// The transport's connections close a moment after Close.
		deadline := time.Now().Add(10 * time.Second)
		for open.Load() != 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if n := open.Load(); n != 0 || dialed.Load() == 0 {
			t.Fatalf("topic missing %v: %d of %d connections still open after New and Close, three times", missing, n, dialed.Load())
		}
	}
}

// countedConn takes itself off open when it is first closed.
type countedConn struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}
