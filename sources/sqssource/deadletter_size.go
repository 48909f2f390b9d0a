package sqssource

import (
	"cmp"
	"slices"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/metatext"
)

// MaxMessageSize is the largest message SQS accepts, in bytes: the body plus
// every message attribute's name, data type and value (256 KiB). A queue's
// MaximumMessageSize attribute may set a lower limit.
const MaxMessageSize = 262144

// Reason lengths fitDeadLetter keeps before it drops other attributes.
const (
	// keepReasonBytes is kept of the reason before the original's own
	// attributes are dropped.
	keepReasonBytes = 256
	// minReasonBytes is kept of the reason before the source's own
	// attributes (key, queue, message id, attempts) are dropped.
	minReasonBytes = 64
)

// attributeSize is what SQS counts for one message attribute: its name, data
// type and value.
func attributeSize(name string, v types.MessageAttributeValue) int {
	return len(name) + len(aws.ToString(v.DataType)) + len(aws.ToString(v.StringValue)) + len(v.BinaryValue)
}

// messageSize is what SQS counts for a message: the body and the attributes.
func messageSize(body string, attrs map[string]types.MessageAttributeValue) int {
	n := len(body)
	for name, v := range attrs {
		n += attributeSize(name, v)
	}
	return n
}

// fitDeadLetter shrinks attrs, the attributes of a dead-letter copy of body,
// until the copy fits in limit bytes. It drops the original's attributes
// (largest first) while the reason would be cut below 256 bytes, then the key
// attribute, MetaOriginQueue, MetaOriginMessageID, consumer.MetaAttempts and
// consumer.MetaKey while it would be cut below 64 bytes, then cuts the reason to what is left (dropping it if
// not one byte is). It returns the names it dropped and whether the reason
// was cut, and false if not even the body alone fits.
func fitDeadLetter(body string, attrs map[string]types.MessageAttributeValue, keyAttr string, limit int) (dropped []string, cut, ok bool) {
	if messageSize(body, attrs) <= limit {
		return nil, false, true
	}
	reason, hasReason := attrs[consumer.MetaReason]
	text := aws.ToString(reason.StringValue)
	delete(attrs, consumer.MetaReason)
	reasonOverhead := 0
	if hasReason {
		reasonOverhead = attributeSize(consumer.MetaReason, types.MessageAttributeValue{DataType: reason.DataType})
	}
	// room is what is left for the reason's text.
	room := func() int { return limit - messageSize(body, attrs) - reasonOverhead }
	drop := func(floor int, names []string) {
		for _, name := range names {
			if room() >= min(len(text), floor) {
				return
			}
			if _, has := attrs[name]; has {
				delete(attrs, name)
				dropped = append(dropped, name)
			}
		}
	}

	var theirs []string
	for name := range attrs {
		switch name {
		case consumer.MetaAttempts, MetaOriginQueue, MetaOriginMessageID, consumer.MetaKey, keyAttr:
		default:
			theirs = append(theirs, name)
		}
	}
	slices.SortFunc(theirs, func(a, b string) int {
		return cmp.Or(cmp.Compare(attributeSize(b, attrs[b]), attributeSize(a, attrs[a])), cmp.Compare(a, b))
	})
	drop(keepReasonBytes, theirs)
	drop(minReasonBytes, []string{keyAttr, MetaOriginQueue, MetaOriginMessageID, consumer.MetaAttempts, consumer.MetaKey})
	drop(1, theirs) // when there is no reason to keep

	if hasReason {
		switch n := room(); {
		case n >= len(text):
			attrs[consumer.MetaReason] = reason
		case n >= 1: // SQS refuses an empty String attribute
			attrs[consumer.MetaReason] = types.MessageAttributeValue{DataType: reason.DataType, StringValue: aws.String(metatext.Cut(text, n))}
			cut = true
		default:
			dropped = append(dropped, consumer.MetaReason)
		}
	}
	return dropped, cut, messageSize(body, attrs) <= limit
}

// parseMaximumMessageSize reads a queue's MaximumMessageSize attribute; an
// absent or unreadable one is MaxMessageSize.
func parseMaximumMessageSize(v string) int {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > MaxMessageSize {
		return MaxMessageSize
	}
	return n
}
