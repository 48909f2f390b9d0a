package kafkasource

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
)

// DefaultTopicRetention is Kafka's default log.retention (7 days), assumed
// for a topic whose retention.ms the broker does not report.
const DefaultTopicRetention = 7 * 24 * time.Hour

var _ consumer.HorizonReporter = (*Source)(nil)

// RedeliveryHorizon returns the longest retention.ms of the source's topics,
// read from the brokers with DescribeConfigs, or consumer.Unbounded when one
// of them keeps messages for ever (retention.ms -1). That is how old a
// message may be when it is delivered again: a rebalance or a crash
// redelivers from the committed offset, and a group whose committed offsets
// expired (offsets.retention.minutes, 7 days by default, counted from when
// the group became empty) starts again at Config.StartOffset, by default the
// oldest retained message, which is at most retention.ms old. The offsets
// retention therefore does not lengthen the horizon. Kafka deletes whole
// segments, so on a quiet topic a message may outlive retention.ms by up to
// segment.ms; that slack is not included. The Runner calls it when Run starts
// (see consumer.HorizonReporter).
func (s *Source) RedeliveryHorizon(ctx context.Context) (time.Duration, error) {
	req := &kafka.DescribeConfigsRequest{}
	for _, t := range s.cfg.Topics {
		req.Resources = append(req.Resources, kafka.DescribeConfigRequestResource{
			ResourceType: kafka.ResourceTypeTopic, ResourceName: t, ConfigNames: []string{"retention.ms"},
		})
	}
	resp, err := s.client.DescribeConfigs(ctx, req)
	if err != nil {
		return 0, fmt.Errorf("kafkasource: describe the retention of topics %v: %w", s.cfg.Topics, err)
	}
	return horizonOf(resp.Resources)
}

// horizonOf returns the longest retention.ms among resources.
func horizonOf(resources []kafka.DescribeConfigResponseResource) (time.Duration, error) {
	var horizon time.Duration
	for _, r := range resources {
		if r.Error != nil {
			return 0, fmt.Errorf("kafkasource: describe the retention of topic %q: %w", r.ResourceName, r.Error)
		}
		retention := DefaultTopicRetention
		for _, e := range r.ConfigEntries {
			if e.ConfigName != "retention.ms" {
				continue
			}
			ms, err := strconv.ParseInt(e.ConfigValue, 10, 64)
			switch {
			case err != nil:
				return 0, fmt.Errorf("kafkasource: topic %q: retention.ms %q is not a number", r.ResourceName, e.ConfigValue)
			case ms < 0:
				return consumer.Unbounded, nil
			}
			retention = time.Duration(ms) * time.Millisecond
		}
		horizon = max(horizon, retention)
	}
	return horizon, nil
}
