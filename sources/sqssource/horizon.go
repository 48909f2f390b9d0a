package sqssource

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/consumer"
)

// DefaultMessageRetention is SQS's default MessageRetentionPeriod (4 days),
// assumed when a queue does not report its own.
const DefaultMessageRetention = 4 * 24 * time.Hour

var _ consumer.HorizonReporter = (*Source)(nil)

// RedeliveryHorizon returns the queue's MessageRetentionPeriod, read with
// GetQueueAttributes: SQS may deliver a message until it is that old, so a
// dedup record must be kept at least that long for every redelivery to be
// recognised. The Runner calls it when Run starts (see
// consumer.HorizonReporter). A queue that does not report the attribute is
// taken to have SQS's default, DefaultMessageRetention.
func (s *Source) RedeliveryHorizon(ctx context.Context) (time.Duration, error) {
	attrs, err := s.queueAttributes(ctx, s.cfg.QueueURL, types.QueueAttributeNameMessageRetentionPeriod)
	if err != nil {
		return 0, err
	}
	v, ok := attrs[string(types.QueueAttributeNameMessageRetentionPeriod)]
	if !ok || v == "" {
		return DefaultMessageRetention, nil
	}
	secs, err := strconv.ParseInt(v, 10, 64)
	if err != nil || secs < 0 {
		return 0, fmt.Errorf("sqssource: queue %s: MessageRetentionPeriod %q is not a number of seconds", s.queueName, v)
	}
	return time.Duration(secs) * time.Second, nil
}
