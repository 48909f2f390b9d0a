package kafkasource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/sources/internal/brokerkit"
)

// ErrTopicNotFound is matched by the error Receive returns while one of
// Config.Topics does not exist on the cluster: the runner counts it as a
// receive failure (Health is not ready) and logs it until the topic is
// created.
var ErrTopicNotFound = errors.New("kafkasource: topic does not exist")

// topicCheckInterval is how often a source looks again for its missing
// topics.
const topicCheckInterval = 2 * time.Second

// watchTopics looks the source's topics up every topicCheckInterval until
// all of them exist, starting with missing, the topics New found missing
// when checked (New looked them up). It reports the missing ones through
// Receive (s.errs) and a WARN line, the first at once and then one per
// brokerkit.Reminder, and makes the group rebalance once they
// appear. A failed lookup (no broker reachable) is left to the fetch loop
// to report.
func (s *Source) watchTopics(ctx context.Context, missing []string, checked bool) {
	var warnedAt time.Time
	for {
		var err error
		if !checked {
			missing, err = missingTopics(ctx, s.client, s.cfg.Topics)
		}
		checked = false
		switch {
		case err == nil && len(missing) == 0:
			if !warnedAt.IsZero() {
				s.rejoin(ctx)
			}
			return
		case err == nil:
			err = fmt.Errorf("%w: %q: create it (or enable auto.create.topics.enable on the brokers); nothing is received from it until it exists", ErrTopicNotFound, missing)
			if warnedAt.IsZero() || time.Since(warnedAt) >= brokerkit.Reminder {
				warnedAt = time.Now()
				s.log.WarnContext(ctx, "topic missing", consumer.LogKeyError, err)
			}
			select {
			case s.errs <- err:
			default: // an earlier error is still waiting to be reported
			}
		}
		if !brokerkit.Sleep(ctx.Done(), topicCheckInterval) {
			return
		}
	}
}

// missingTopics returns the topics the cluster's metadata does not know,
// without creating them.
func missingTopics(ctx context.Context, c *kafka.Client, topics []string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, t := range resp.Topics {
		if errors.Is(t.Error, kafka.UnknownTopicOrPartition) {
			missing = append(missing, t.Name)
		}
	}
	return missing, nil
}

// rejoin makes the consumer group rebalance once, so that the reader's
// group, which joined while a topic was missing, is assigned its
// partitions: kafka-go's reader assigns the partitions it found when it
// joined and does not watch a topic that did not exist then. A member that
// joins and leaves at once starts the rebalance; it fetches nothing.
func (s *Source) rejoin(ctx context.Context) {
	s.log.InfoContext(ctx, "the missing topics exist now; rebalancing the group to get their partitions")
	g, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                s.cfg.GroupID,
		Brokers:           s.cfg.Brokers,
		Dialer:            s.cfg.Dialer,
		Topics:            s.cfg.Topics,
		HeartbeatInterval: s.cfg.HeartbeatInterval,
		SessionTimeout:    s.cfg.SessionTimeout,
		RebalanceTimeout:  s.cfg.RebalanceTimeout,
		JoinGroupBackoff:  s.cfg.JoinGroupBackoff,
		Logger:            kafkaLogger(s.cfg.Logger, slog.LevelDebug),
		ErrorLogger:       kafkaLogger(s.cfg.Logger, slog.LevelDebug),
	})
	if err != nil {
		s.log.WarnContext(ctx, "could not rebalance the group; restart the worker to consume the new topics", consumer.LogKeyError, err)
		return
	}
	defer g.Close()
	jctx, cancel := context.WithTimeout(ctx, s.cfg.RebalanceTimeout+s.cfg.SessionTimeout)
	defer cancel()
	if _, err := g.Next(jctx); err != nil && ctx.Err() == nil {
		s.log.WarnContext(ctx, "could not rebalance the group; restart the worker to consume the new topics", consumer.LogKeyError, err)
	}
}
