package kafkasource

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/sources/internal/brokerkit"
)

// TopicSpec describes a topic for CreateTopics.
type TopicSpec struct {
	// Name is the topic's name. Required.
	Name string
	// Partitions is the number of partitions. Defaults to 1.
	Partitions int
	// ReplicationFactor is the number of replicas of each partition.
	// Defaults to 1.
	ReplicationFactor int
}

// DeadLetterTopic returns the name of topic's default dead-letter topic,
// topic + ".dlq".
func DeadLetterTopic(topic string) string { return topic + ".dlq" }

// CreateTopics creates the topics through the cluster's controller and waits
// until the metadata of every broker of brokers that answers lists each of
// them with all its partitions led, so that a consumer or producer started
// next finds them, whichever broker it asks. A topic that
// exists already is left as it is. dialer may be nil (kafka.DefaultDialer).
// The context bounds the whole call.
//
// It is meant for tests, demos and quick starts; production topics are
// usually created by operations, with the partition count and replication
// the workload needs. Remember the dead-letter topics (DeadLetterTopic).
func CreateTopics(ctx context.Context, dialer *kafka.Dialer, brokers []string, topics ...TopicSpec) error {
	if len(brokers) == 0 {
		return &idemq.ConfigError{Field: "kafkasource.CreateTopics(brokers)", Reason: "required"}
	}
	configs := make([]kafka.TopicConfig, 0, len(topics))
	for i, t := range topics {
		if t.Name == "" {
			return &idemq.ConfigError{Field: "kafkasource.TopicSpec.Name", Reason: fmt.Sprintf("topic %d has no name", i)}
		}
		if t.Partitions < 0 || t.ReplicationFactor < 0 {
			return &idemq.ConfigError{Field: "kafkasource.TopicSpec", Reason: fmt.Sprintf("topic %q: negative partitions or replication factor", t.Name)}
		}
		configs = append(configs, kafka.TopicConfig{
			Topic: t.Name, NumPartitions: max(t.Partitions, 1), ReplicationFactor: max(t.ReplicationFactor, 1),
		})
	}
	if len(configs) == 0 {
		return nil
	}

	return onController(ctx, dialer, brokers, "create topics", func(cc *kafka.Conn) error {
		if err := cc.CreateTopics(configs...); !errors.Is(err, kafka.TopicAlreadyExists) {
			return err
		}
		return nil
	}, func(*kafka.Conn) (bool, error) {
		// Each broker learns of a new topic on its own: a producer that
		// asked one that had not yet was refused (Unknown Topic Or
		// Partition). A broker that does not answer is not asked.
		for _, b := range brokers {
			conn, err := cmp.Or(dialer, kafka.DefaultDialer).DialContext(ctx, "tcp", b)
			if err != nil {
				continue
			}
			led, err := topicsLed(ctx, conn, configs)
			_ = conn.Close()
			if !led || err != nil {
				return false, err
			}
		}
		return true, nil
	})
}

// topicsLed reports whether conn's broker's metadata shows every partition
// of topics with a leader.
func topicsLed(ctx context.Context, conn *kafka.Conn, topics []kafka.TopicConfig) (bool, error) {
	setDeadline(ctx, conn)
	for _, t := range topics {
		parts, err := conn.ReadPartitions(t.Topic)
		if err != nil || len(parts) < t.NumPartitions || slices.ContainsFunc(parts, func(p kafka.Partition) bool { return p.Leader.Host == "" }) {
			return false, err
		}
	}
	return true, nil
}

// DeleteTopics deletes the topics through the cluster's controller and waits
// until the brokers' metadata no longer lists any of them, so that a topic of
// the same name created next starts empty. A topic that does not exist is
// fine. dialer may be nil (kafka.DefaultDialer). The context bounds the whole
// call.
//
// It is meant for tests and demos, to remove what CreateTopics made; remember
// the dead-letter topics (DeadLetterTopic).
func DeleteTopics(ctx context.Context, dialer *kafka.Dialer, brokers []string, topics ...string) error {
	if len(brokers) == 0 {
		return &idemq.ConfigError{Field: "kafkasource.DeleteTopics(brokers)", Reason: "required"}
	}
	if slices.Contains(topics, "") {
		return &idemq.ConfigError{Field: "kafkasource.DeleteTopics(topics)", Reason: "a topic has no name"}
	}
	if len(topics) == 0 {
		return nil
	}
	// kafka-go reports the first topic's error only; a topic that could not
	// be deleted for another reason stays listed, and the wait ends with the
	// context. The wait's request names no topic: one that names a deleted
	// topic could create it again on a broker that creates topics
	// automatically.
	return onController(ctx, dialer, brokers, "delete topics", func(cc *kafka.Conn) error {
		if err := cc.DeleteTopics(topics...); !errors.Is(err, kafka.UnknownTopicOrPartition) {
			return err
		}
		return nil
	}, func(conn *kafka.Conn) (bool, error) {
		parts, err := conn.ReadPartitions()
		return err == nil && !slices.ContainsFunc(parts, func(p kafka.Partition) bool { return slices.Contains(topics, p.Topic) }), err
	})
}

// onController runs op (what names it in errors) on a connection to the
// cluster's controller, then calls done on a connection to the first of
// brokers that answers every 50 ms until it reports true, all bounded by
// ctx; dialer nil is kafka.DefaultDialer.
func onController(ctx context.Context, dialer *kafka.Dialer, brokers []string, what string, op func(*kafka.Conn) error, done func(*kafka.Conn) (bool, error)) error {
	if dialer == nil {
		dialer = kafka.DefaultDialer
	}
	var conn *kafka.Conn
	var err error
	for _, b := range brokers {
		if conn, err = dialer.DialContext(ctx, "tcp", b); err == nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("kafkasource: %s: dial: %w", what, err)
	}
	defer conn.Close()
	setDeadline(ctx, conn)
	c, err := conn.Controller()
	if err != nil {
		return fmt.Errorf("kafkasource: %s: find controller: %w", what, err)
	}
	cc, err := dialer.DialContext(ctx, "tcp", net.JoinHostPort(c.Host, strconv.Itoa(c.Port)))
	if err != nil {
		return fmt.Errorf("kafkasource: %s: dial controller: %w", what, err)
	}
	defer cc.Close()
	setDeadline(ctx, cc)
	if err := op(cc); err != nil {
		return fmt.Errorf("kafkasource: %s: %w", what, err)
	}
	if err := brokerkit.Poll(ctx, 50*time.Millisecond, func() (bool, error) { return done(conn) }); err != nil {
		return fmt.Errorf("kafkasource: %s: waiting for the metadata to show it: %w", what, err)
	}
	return nil
}

func setDeadline(ctx context.Context, c *kafka.Conn) {
	if d, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(d)
	}
}
