package kafkasource

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
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
// topic + DefaultDeadLetterSuffix.
func DeadLetterTopic(topic string) string { return topic + DefaultDeadLetterSuffix }

// CreateTopics creates the topics through the cluster's controller and waits
// until the brokers' metadata lists each of them with all its partitions led,
// so that a consumer or producer started next finds them. A topic that
// exists already is left as it is. dialer may be nil (kafka.DefaultDialer).
// The context bounds the whole call.
//
// It is meant for tests, demos and quick starts; production topics are
// usually created by operations, with the partition count and replication
// the workload needs. Remember the dead-letter topics (DeadLetterTopic).
func CreateTopics(ctx context.Context, dialer *kafka.Dialer, brokers []string, topics ...TopicSpec) error {
	if dialer == nil {
		dialer = kafka.DefaultDialer
	}
	if len(brokers) == 0 {
		return &ConfigError{Field: "kafkasource.CreateTopics(brokers)", Reason: "required"}
	}
	topics = slices.Clone(topics)
	configs := make([]kafka.TopicConfig, 0, len(topics))
	for i, t := range topics {
		if t.Name == "" {
			return &ConfigError{Field: "kafkasource.TopicSpec.Name", Reason: fmt.Sprintf("topic %d has no name", i)}
		}
		if t.Partitions < 0 || t.ReplicationFactor < 0 {
			return &ConfigError{Field: "kafkasource.TopicSpec", Reason: fmt.Sprintf("topic %q: negative partitions or replication factor", t.Name)}
		}
		topics[i].Partitions = max(t.Partitions, 1)
		topics[i].ReplicationFactor = max(t.ReplicationFactor, 1)
		configs = append(configs, kafka.TopicConfig{
			Topic:             t.Name,
			NumPartitions:     topics[i].Partitions,
			ReplicationFactor: topics[i].ReplicationFactor,
		})
	}
	if len(configs) == 0 {
		return nil
	}

	var conn *kafka.Conn
	var err error
	for _, b := range brokers {
		if conn, err = dialer.DialContext(ctx, "tcp", b); err == nil {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("kafkasource: create topics: dial: %w", err)
	}
	defer conn.Close()
	setDeadline(ctx, conn)
	controller, err := conn.Controller()
	if err != nil {
		return fmt.Errorf("kafkasource: create topics: find controller: %w", err)
	}
	cc, err := dialer.DialContext(ctx, "tcp", net.JoinHostPort(controller.Host, strconv.Itoa(controller.Port)))
	if err != nil {
		return fmt.Errorf("kafkasource: create topics: dial controller: %w", err)
	}
	defer cc.Close()
	setDeadline(ctx, cc)
	if err := cc.CreateTopics(configs...); err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
		return fmt.Errorf("kafkasource: create topics: %w", err)
	}

	// Wait for the metadata to show every partition with a leader.
	for _, t := range topics {
		for {
			parts, err := conn.ReadPartitions(t.Name)
			if err == nil && len(parts) >= t.Partitions && allLed(parts) {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("kafkasource: create topics: waiting for %q to appear: %w (last error: %w)", t.Name, ctx.Err(), err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

func allLed(parts []kafka.Partition) bool {
	for _, p := range parts {
		if p.Leader.Host == "" {
			return false
		}
	}
	return true
}

func setDeadline(ctx context.Context, c *kafka.Conn) {
	if d, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(d)
	}
}
