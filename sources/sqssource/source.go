package sqssource

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/cfgerr"
)

// Client is the part of the SQS API that a Source uses. *sqs.Client satisfies
// it; wrap one to add instrumentation. It must be safe for concurrent use.
type Client interface {
	ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, optFns ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	DeleteMessageBatch(ctx context.Context, in *sqs.DeleteMessageBatchInput, optFns ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error)
	ChangeMessageVisibility(ctx context.Context, in *sqs.ChangeMessageVisibilityInput, optFns ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error)
	ChangeMessageVisibilityBatch(ctx context.Context, in *sqs.ChangeMessageVisibilityBatchInput, optFns ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityBatchOutput, error)
	SendMessage(ctx context.Context, in *sqs.SendMessageInput, optFns ...func(*sqs.Options)) (*sqs.SendMessageOutput, error)
	GetQueueAttributes(ctx context.Context, in *sqs.GetQueueAttributesInput, optFns ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error)
}

var _ Client = (*sqs.Client)(nil)

var _ consumer.Source = (*Source)(nil)

// Message attributes that DeadLetter adds to the copy it sends to
// Config.DeadLetterQueueURL.
const (
	// AttrReason holds the error that sent the message to the dead-letter
	// queue (at most 2 KiB of its text).
	AttrReason = consumer.MetaReason
	// AttrAttempts holds the number of attempts made (a Number attribute).
	AttrAttempts = consumer.MetaAttempts
	// AttrSourceQueue holds the URL of the queue the message came from.
	AttrSourceQueue = "idemq-source-queue"
	// AttrMessageID holds the MessageId of the original message.
	AttrMessageID = "idemq-message-id"
)

// Log attribute keys used by the source, in addition to consumer's LogKey*.
const (
	LogKeyQueue = "queue"
)

// maxReasonBytes bounds the reason text stored in AttrReason.
const maxReasonBytes = 2048

// maxMessageAttributes is the number of message attributes SQS accepts on one
// message.
const maxMessageAttributes = 10

// fifoDeadLetterGroup is the MessageGroupId of dead letters whose original had
// none (it cannot happen on a FIFO queue, but SendMessage requires one).
const fifoDeadLetterGroup = "idemq-dead-letters"

// systemAttributes are the system attributes requested with every receive.
var systemAttributes = []types.MessageSystemAttributeName{
	types.MessageSystemAttributeNameApproximateReceiveCount,
	types.MessageSystemAttributeNameMessageGroupId,
	types.MessageSystemAttributeNameMessageDeduplicationId,
	types.MessageSystemAttributeNameSentTimestamp,
	types.MessageSystemAttributeNameSequenceNumber,
	types.MessageSystemAttributeNameAWSTraceHeader,
}

// Source receives messages from one SQS queue for a consumer.Runner. It
// implements consumer.Source: it deletes a message only when Ack is called
// (after the runner's transaction committed), keeps the visibility of every
// received, unsettled message extended (the heartbeat), retries by changing
// the visibility timeout, and dead-letters to Config.DeadLetterQueueURL or
// through the queue's redrive policy.
//
// Message values it returns carry the SQS types.Message in Raw, the
// MessageId in ID, ApproximateReceiveCount in Attempt and, on FIFO queues, the
// MessageGroupId in PartitionKey.
//
// A Source is safe for concurrent use. Close it after the Runner using it
// has returned.
type Source struct {
	client    Client
	cfg       Config
	log       *slog.Logger
	queueName string
	fifo      bool
	// maxReceiveCount is the redrive policy's maxReceiveCount, or 0.
	maxReceiveCount int
	// deadLetterLimit is the dead-letter queue's MaximumMessageSize.
	deadLetterLimit int

	closeCtx    context.Context // cancelled by Close
	cancelClose context.CancelFunc
	closeOnce   sync.Once
	bg          sync.WaitGroup // heartbeat and receive calls

	// visMu orders visibility changes: the heartbeat holds it exclusively
	// while it extends a batch, Retry and DeadLetter hold it shared while
	// they stop tracking a message and change its visibility, so that an
	// extension never overrides a retry delay.
	visMu sync.RWMutex

	mu          sync.Mutex
	closed      bool
	inflight    map[*handle]struct{} // received, not settled; includes ready
	ready       []*consumer.Message  // received, not yet returned by Receive
	active      map[string]*handle   // strict FIFO: group -> message handed out, unsettled
	polls       int                  // ReceiveMessage calls in progress
	pollErr     error                // last failed call, for the next Receive
	deletes     []pendingDelete      // Ack entries waiting for a DeleteMessageBatch call
	deleteCalls int                  // DeleteMessageBatch calls in flight
	wake        chan struct{}        // closed and replaced when the above change

	stats counters
}

// handle is the Message.Handle of a message received by a Source.
type handle struct {
	src        *Source
	raw        types.Message
	receipt    string
	id         string
	group      string    // MessageGroupId, FIFO queues only
	receivedAt time.Time // just before the ReceiveMessage call was sent

	// Guarded by src.mu.
	extendedAt time.Time // start of the current visibility timeout
	done       bool      // no longer extended: MaxExtension passed or handle invalid
}

// New returns a Source for cfg.QueueURL. It checks that the queue exists,
// reads whether it is a FIFO queue and its redrive policy, and checks the
// dead-letter route: it returns ErrNoDeadLetterRoute when neither
// cfg.DeadLetterQueueURL nor a redrive policy is set, and a
// *consumer.ConfigError for each invalid field of cfg (after WithDefaults),
// all at once.
//
// The heartbeat starts at once; Close stops it.
func New(ctx context.Context, client Client, cfg Config) (*Source, error) {
	var bad cfgerr.List
	if client == nil {
		bad.Include(&consumer.ConfigError{Field: "sqssource.New(client)", Reason: "nil"})
	}
	cfg = cfg.WithDefaults()
	bad.Include(cfg.validate())
	if err := bad.Err(); err != nil {
		return nil, err
	}
	s := &Source{
		client:    client,
		cfg:       cfg,
		queueName: queueName(cfg.QueueURL),
		inflight:  make(map[*handle]struct{}),
		active:    make(map[string]*handle),
		wake:      make(chan struct{}),
	}
	s.log = cfg.Logger.With(LogKeyQueue, s.queueName)

	attrs, err := s.queueAttributes(ctx, cfg.QueueURL, types.QueueAttributeNameFifoQueue, types.QueueAttributeNameRedrivePolicy)
	if err != nil {
		return nil, err
	}
	s.fifo = attrs[string(types.QueueAttributeNameFifoQueue)] == "true"
	if p := attrs[string(types.QueueAttributeNameRedrivePolicy)]; p != "" {
		if s.maxReceiveCount, err = parseMaxReceiveCount(p); err != nil {
			return nil, fmt.Errorf("sqssource: queue %s: %w", s.queueName, err)
		}
	}
	switch {
	case cfg.DeadLetterQueueURL != "":
		dl, err := s.queueAttributes(ctx, cfg.DeadLetterQueueURL, types.QueueAttributeNameFifoQueue, types.QueueAttributeNameMaximumMessageSize)
		if err != nil {
			return nil, err
		}
		s.deadLetterLimit = parseMaximumMessageSize(dl[string(types.QueueAttributeNameMaximumMessageSize)])
		if dlFIFO := dl[string(types.QueueAttributeNameFifoQueue)] == "true"; dlFIFO != s.fifo {
			return nil, configError("DeadLetterQueueURL", fmt.Sprintf("FIFO is %v for the dead-letter queue but %v for the queue", dlFIFO, s.fifo))
		}
	case s.maxReceiveCount == 0:
		return nil, fmt.Errorf("%w (queue %s)", ErrNoDeadLetterRoute, s.queueName)
	}

	s.closeCtx, s.cancelClose = context.WithCancel(context.WithoutCancel(ctx))
	if cfg.heartbeat() {
		s.bg.Go(s.heartbeat)
	}
	return s, nil
}

// NewClient returns an SQS client configured through the default
// aws-sdk-go-v2 chain (environment, shared config and credentials files, web
// identity, container and instance roles), adjusted by optFns (for example
// config.WithRegion). A non-empty endpoint overrides the service endpoint,
// for ElasticMQ or LocalStack; the chain also honours AWS_ENDPOINT_URL_SQS.
func NewClient(ctx context.Context, endpoint string, optFns ...func(*config.LoadOptions) error) (*sqs.Client, error) {
	cfg, err := config.LoadDefaultConfig(ctx, optFns...)
	if err != nil {
		return nil, fmt.Errorf("sqssource: load AWS configuration: %w", err)
	}
	return sqs.NewFromConfig(cfg, func(o *sqs.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
		}
	}), nil
}

// FIFO reports whether the queue is a FIFO queue.
func (s *Source) FIFO() bool { return s.fifo }

// MaxReceiveCount returns the maxReceiveCount of the queue's redrive policy,
// or 0 if it has none. When dead-lettering is left to the redrive policy,
// set the runner's RetryPolicy.MaxAttempts to at least this value, so that
// SQS, which keeps the message, moves it before the runner gives up on it.
func (s *Source) MaxReceiveCount() int { return s.maxReceiveCount }

// Receive returns up to max received messages, waiting (long polling) until
// at least one is available, ctx is done or the Source is closed. It keeps up
// to Config.MaxReceivers ReceiveMessage calls in flight (one per 10
// messages), and starts the next ones before it returns, so that receiving
// overlaps with handling. Every call asks for 10 messages (the most SQS
// returns at once, for the price of one), and a new call starts only while
// fewer than max are buffered or being received, so at most max+9 messages
// wait ahead of the caller, their visibility extended by the heartbeat. A call still in flight when Receive returns is not
// cancelled, since SQS may already have hidden the messages it returns: its
// messages are kept in flight, with their visibility extended, for the next
// Receive. Close cancels the calls still in flight; messages that SQS had
// already hidden for such a call are lost to this Source and stay invisible
// until their VisibilityTimeout ends (up to one VisibilityTimeout of delay,
// no loss). Messages of calls that completed are released by Close.
//
// Receive returns ctx's error (wrapped) when ctx is done, consumer.ErrClosed
// after Close, and the error of a failed ReceiveMessage call when no message
// is available. It deletes nothing.
func (s *Source) Receive(ctx context.Context, max int) ([]*consumer.Message, error) {
	if max < 1 {
		max = 1
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("sqssource: receive: %w", err)
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, consumer.ErrClosed
		}
		if out := s.take(max); len(out) > 0 {
			// Receive the next messages while the caller handles these.
			s.prefetch(max)
			s.mu.Unlock()
			return out, nil
		}
		if err := s.pollErr; err != nil {
			s.pollErr = nil
			s.mu.Unlock()
			return nil, err
		}
		s.prefetch(max)
		wake := s.wake
		s.mu.Unlock()

		select {
		case <-ctx.Done():
		case <-s.closeCtx.Done():
		case <-wake:
		}
	}
}

// prefetch starts ReceiveMessage calls for 10 messages each, at most
// Config.MaxReceivers at a time, until the messages buffered or being
// received cover max. s.mu must be held.
func (s *Source) prefetch(max int) {
	want := min((max+MaxBatch-1)/MaxBatch, s.cfg.MaxReceivers)
	for s.polls < want && len(s.ready)+s.polls*MaxBatch < max {
		s.polls++
		s.bg.Go(func() { s.poll(MaxBatch) })
	}
}

// take removes up to max messages from the ready buffer and returns them. In
// strict FIFO order it takes at most one message per group, and none of a
// group whose previous message is still being handled. s.mu must be held.
func (s *Source) take(max int) []*consumer.Message {
	if !s.strictOrder() {
		n := min(max, len(s.ready))
		out := slices.Clone(s.ready[:n])
		clear(s.ready[:n])
		s.ready = s.ready[n:]
		return out
	}
	var out []*consumer.Message
	keep := s.ready[:0]
	for _, m := range s.ready {
		h := m.Handle.(*handle)
		if len(out) == max || s.active[h.group] != nil {
			keep = append(keep, m)
			continue
		}
		s.active[h.group] = h
		out = append(out, m)
	}
	clear(s.ready[len(keep):])
	s.ready = keep
	return out
}

// strictOrder reports whether Receive hands out one message per FIFO group at
// a time.
func (s *Source) strictOrder() bool { return s.fifo && !s.cfg.RelaxedFIFOOrder }

// poll makes one ReceiveMessage call for up to count messages and hands its
// result to Receive.
func (s *Source) poll(count int) {
	ctx, cancel := context.WithTimeout(s.closeCtx, s.cfg.WaitTime+s.cfg.RequestTimeout)
	defer cancel()
	in := &sqs.ReceiveMessageInput{
		QueueUrl:                    aws.String(s.cfg.QueueURL),
		MaxNumberOfMessages:         int32(count),
		WaitTimeSeconds:             int32(s.cfg.WaitTime / time.Second),
		VisibilityTimeout:           int32(s.cfg.VisibilityTimeout / time.Second),
		MessageSystemAttributeNames: systemAttributes,
		MessageAttributeNames:       []string{"All"},
	}
	if s.fifo {
		// The SDK's retries of this call then return the same messages
		// instead of hiding others until their visibility timeout.
		in.ReceiveRequestAttemptId = aws.String(rand.Text())
	}
	start := time.Now()
	out, err := s.client.ReceiveMessage(ctx, in)

	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.broadcast()
	s.polls--
	if err != nil {
		if s.closed || errors.Is(err, context.Canceled) {
			return
		}
		s.stats.receiveFailures.Add(1)
		s.pollErr = fmt.Errorf("sqssource: receive from %s: %w", s.queueName, err)
		return
	}
	s.stats.received.Add(uint64(len(out.Messages)))
	now := time.Now()
	for _, m := range out.Messages {
		h := &handle{
			src:        s,
			raw:        m,
			receipt:    aws.ToString(m.ReceiptHandle),
			id:         aws.ToString(m.MessageId),
			group:      m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)],
			receivedAt: start,
			extendedAt: start,
		}
		s.inflight[h] = struct{}{}
		s.ready = append(s.ready, s.message(h, now))
	}
}

// broadcast wakes every waiting Receive. s.mu must be held.
func (s *Source) broadcast() {
	close(s.wake)
	s.wake = make(chan struct{})
}

// message converts a received SQS message.
func (s *Source) message(h *handle, now time.Time) *consumer.Message {
	m := h.raw
	attempt := 1
	if n, err := strconv.Atoi(m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)]); err == nil && n > 0 {
		attempt = n
	}
	headers := make(map[string]string, len(m.MessageAttributes))
	for name, v := range m.MessageAttributes {
		if v.StringValue != nil {
			headers[name] = *v.StringValue // String and Number types; Binary only in Raw
		}
	}
	// The X-Ray trace header rides along for tracing hooks (otelidemq),
	// unless a message attribute of that name exists.
	if v, ok := m.Attributes[string(types.MessageSystemAttributeNameAWSTraceHeader)]; ok && v != "" {
		if _, taken := headers[string(types.MessageSystemAttributeNameAWSTraceHeader)]; !taken {
			headers[string(types.MessageSystemAttributeNameAWSTraceHeader)] = v
		}
	}
	key := ""
	if s.cfg.KeyAttribute != "" {
		key = headers[s.cfg.KeyAttribute]
	}
	if key == "" && s.fifo {
		key = m.Attributes[string(types.MessageSystemAttributeNameMessageDeduplicationId)]
	}
	partition := h.group
	if !s.fifo && s.cfg.PartitionKeyAttribute != "" {
		partition = headers[s.cfg.PartitionKeyAttribute]
	}
	return &consumer.Message{
		ID:           h.id,
		Key:          key,
		Body:         []byte(aws.ToString(m.Body)),
		Headers:      headers,
		PartitionKey: partition,
		Topic:        s.queueName,
		Attempt:      attempt,
		Redelivered:  attempt > 1,
		ReceivedAt:   now,
		Raw:          m,
		Handle:       h,
	}
}

// Ack deletes msgs from the queue with DeleteMessageBatch, 10 per call, and
// returns once SQS answered for each. Concurrent Acks share calls: while a
// call is in flight, the messages of other Acks wait for it and leave
// together in the next (see deletes.go), so that one message per Ack does
// not cost one call per message. Entries that fail for a reason that is not the caller's
// fault are sent again (Config.DeleteAttempts in all); the others, such as an
// expired receipt handle (the message was received again meanwhile), are
// reported at once. The error holds a *BatchError naming the entries that
// were not deleted; those messages come back after their visibility timeout and
// are recognised as duplicates. A message that this Source did not return
// (ErrForeignMessage) does not stop the others from being deleted: the errors
// are joined.
func (s *Source) Ack(ctx context.Context, msgs []*consumer.Message) error {
	if s.isClosed() {
		return consumer.ErrClosed
	}
	var errs []error
	hs := make([]*handle, 0, len(msgs))
	for _, m := range msgs {
		h, err := s.handleOf(m)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		hs = append(hs, h)
	}
	s.untrack(hs...)

	failed, err := s.deleteAll(ctx, hs)
	switch {
	case len(failed) > 0:
		errs = append(errs, &BatchError{Op: "DeleteMessageBatch", Entries: failed, Err: err})
	case err != nil:
		errs = append(errs, fmt.Errorf("sqssource: ack: %w", err))
	}
	return errors.Join(errs...)
}

// deleteBatch deletes up to 10 messages, sending failed entries again while
// that can help. It returns the entries that were not deleted and the last
// request-level error.
func (s *Source) deleteBatch(ctx context.Context, hs []*handle) ([]EntryError, error) {
	var (
		failed  []EntryError
		lastErr error
		pending = hs
		reasons = make(map[*handle]EntryError)
	)
	for attempt := 1; attempt <= s.cfg.DeleteAttempts && len(pending) > 0; attempt++ {
		if attempt > 1 && !sleep(ctx, time.Duration(50<<attempt)*time.Millisecond) {
			break
		}
		entries := make([]types.DeleteMessageBatchRequestEntry, len(pending))
		for i, h := range pending {
			entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(h.receipt)}
		}
		cctx, cancel := s.requestContext(ctx)
		out, err := s.client.DeleteMessageBatch(cctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(s.cfg.QueueURL), Entries: entries})
		cancel()
		if err != nil {
			lastErr = err
			if ctx.Err() != nil {
				break
			}
			continue
		}
		var again []*handle
		for _, f := range out.Failed {
			i, err := strconv.Atoi(aws.ToString(f.Id))
			if err != nil || i < 0 || i >= len(pending) {
				// A malformed answer: which entries were deleted is
				// unknown, so report every entry still pending as failed.
				err := fmt.Errorf("sqssource: DeleteMessageBatch answered for unknown entry %q", aws.ToString(f.Id))
				for _, h := range pending {
					failed = append(failed, EntryError{MessageID: h.id, Code: "InvalidResponse", Message: err.Error()})
				}
				return failed, err
			}
			h := pending[i]
			e := EntryError{MessageID: h.id, Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}
			if f.SenderFault {
				failed = append(failed, e)
				continue
			}
			reasons[h] = e
			again = append(again, h)
		}
		pending = again
	}
	for _, h := range pending {
		e, ok := reasons[h]
		if !ok {
			e = EntryError{MessageID: h.id, Code: "RequestFailed", Message: fmt.Sprint(lastErr)}
		}
		failed = append(failed, e)
	}
	return failed, lastErr
}

// Retry makes msg visible again after delay (rounded up to whole seconds, at
// most what is left of the 12-hour visibility limit) with
// ChangeMessageVisibility. SQS then delivers it again with a higher
// ApproximateReceiveCount, hence a higher Attempt. On a FIFO queue the
// message's group waits for it, and, unless Config.RelaxedFIFOOrder, the
// later messages of its group that were already received are made visible
// again so that they follow it. If the call fails, the message comes back
// when its current visibility timeout ends.
func (s *Source) Retry(ctx context.Context, msg *consumer.Message, delay time.Duration) error {
	if s.isClosed() {
		return consumer.ErrClosed
	}
	h, err := s.handleOf(msg)
	if err != nil {
		return err
	}
	delay = min(max(delay, 0), MaxVisibility-time.Since(h.receivedAt)-time.Second)
	if err := s.setVisibility(ctx, h, delay); err != nil {
		return fmt.Errorf("sqssource: retry %s: %w", h.id, err)
	}
	s.stats.retried.Add(1)
	return nil
}

// setVisibility stops tracking h and makes it visible after d. In strict FIFO
// order it then returns the messages of h's group waiting in the ready buffer
// to the queue, so that SQS delivers them again after h.
func (s *Source) setVisibility(ctx context.Context, h *handle, d time.Duration) error {
	s.visMu.RLock()
	defer s.visMu.RUnlock()
	followers := s.giveBack(h)
	cctx, cancel := s.requestContext(ctx)
	_, err := s.client.ChangeMessageVisibility(cctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl:          aws.String(s.cfg.QueueURL),
		ReceiptHandle:     aws.String(h.receipt),
		VisibilityTimeout: seconds(d),
	})
	cancel()
	for chunk := range slices.Chunk(followers, MaxBatch) {
		if _, ferr := s.changeVisibility(ctx, chunk, func(*handle) time.Duration { return 0 }); ferr != nil {
			s.log.WarnContext(ctx, "returning later messages of a FIFO group failed; they return after their visibility timeout",
				consumer.LogKeyID, h.id, consumer.LogKeyError, ferr)
		}
	}
	return err
}

// DeadLetter routes msg to the dead-letter queue.
//
// With Config.DeadLetterQueueURL it sends a copy there (same body, its
// message attributes, plus AttrReason, AttrAttempts, AttrSourceQueue and
// AttrMessageID; on FIFO queues the same MessageGroupId and the original
// MessageId as MessageDeduplicationId), and deletes the original only after
// the send succeeded. Until both succeeded the original stays in flight (its
// visibility extended and, on a FIFO queue, its group blocked). If either
// fails, the original is made visible again after Config.RedriveDelay, like
// a retry (in strict FIFO order the later messages of its group that were
// already received go back to the queue to follow it), and DeadLetter
// returns the error. If the delete failed, the original is then delivered
// and dead-lettered again, and the dead-letter queue holds two copies (a FIFO
// dead-letter queue drops the second within its 5-minute deduplication
// interval). SQS allows 10 message attributes: if the original has more than
// fit beside the four above, the configured KeyAttribute is kept first, then
// the others in name order, and the rest is dropped (and logged).
//
// The copy must fit in the dead-letter queue's MaximumMessageSize (read at
// New; 256 KiB at most), body and attributes together, so a message near the
// limit would otherwise never be dead-lettered. The copy is cut to fit: the
// original's attributes are dropped (largest first) before the reason is cut
// below 256 bytes, then the key, queue, message id and attempts attributes
// before it is cut below 64 bytes, then the reason is cut to what is left
// (a maximum-size message keeps only as many bytes of reason as its own
// attributes took). What was cut is logged at WARN; the Runner logs the full
// reason. A body larger than the dead-letter queue's limit goes to the
// queue's redrive policy if it has one (logged at ERROR), else DeadLetter
// fails and the original comes back after Config.RedriveDelay.
//
// Without it, the queue's redrive policy does the work: DeadLetter makes the
// message visible again after Config.RedriveDelay, and SQS moves it to the
// policy's dead-letter queue once it has been received maxReceiveCount times.
// Until then it is received and handled again after each RedriveDelay, up to
// the runner's MaxAttempts times with its retry backoff when the runner's
// store counts handler failures (the count starts afresh after each
// hand-over; see the package documentation, "Attempts"). A handler that
// fails does not commit, so this repeats no effect. The reason is logged,
// not stored.
func (s *Source) DeadLetter(ctx context.Context, msg *consumer.Message, reason error) error {
	if s.isClosed() {
		return consumer.ErrClosed
	}
	h, err := s.handleOf(msg)
	if err != nil {
		return err
	}
	attempts := msg.Attempt
	var dl *consumer.DeadLetterError
	if errors.As(reason, &dl) && dl.Attempts > 0 {
		attempts = dl.Attempts
	}
	var attrs map[string]types.MessageAttributeValue
	if s.cfg.DeadLetterQueueURL != "" {
		attrs = s.deadLetterAttributes(ctx, h, reason, attempts)
		dropped, cut, fits := fitDeadLetter(aws.ToString(h.raw.Body), attrs, s.cfg.KeyAttribute, s.deadLetterLimit)
		switch {
		case !fits && s.maxReceiveCount > 0:
			s.log.ErrorContext(ctx, "message is larger than the dead-letter queue's MaximumMessageSize; left to the queue's redrive policy",
				consumer.LogKeyID, h.id, "size", len(aws.ToString(h.raw.Body)), "limit", s.deadLetterLimit)
			attrs = nil
		case !fits:
			s.putBack(ctx, h)
			return fmt.Errorf("sqssource: dead letter %s: its body (%d bytes) is larger than the dead-letter queue's MaximumMessageSize (%d) and the queue has no redrive policy (the original stays and comes back)",
				h.id, len(aws.ToString(h.raw.Body)), s.deadLetterLimit)
		case cut || len(dropped) > 0:
			s.log.WarnContext(ctx, "dead letter cut to the dead-letter queue's maximum message size", consumer.LogKeyID, h.id,
				"reason_cut", cut, "dropped", dropped, "limit", s.deadLetterLimit)
		}
	}
	if attrs == nil {
		s.log.WarnContext(ctx, "message left to the queue's redrive policy", consumer.LogKeyID, h.id,
			consumer.LogKeyAttempt, attempts, "max_receive_count", s.maxReceiveCount, consumer.LogKeyError, reason)
		if err := s.setVisibility(ctx, h, s.redriveDelay(h)); err != nil {
			return fmt.Errorf("sqssource: dead letter %s through the redrive policy: %w", h.id, err)
		}
		s.stats.deadLettered.Add(1)
		return nil
	}

	// h stays tracked until the original is deleted: the heartbeat keeps it
	// hidden and, in strict FIFO order, its group waits for it.
	in := &sqs.SendMessageInput{
		QueueUrl:          aws.String(s.cfg.DeadLetterQueueURL),
		MessageBody:       h.raw.Body,
		MessageAttributes: attrs,
	}
	if s.fifo {
		group := msg.PartitionKey
		if group == "" {
			group = fifoDeadLetterGroup
		}
		in.MessageGroupId = aws.String(group)
		in.MessageDeduplicationId = aws.String(h.id)
	}
	sctx, cancel := s.requestContext(ctx)
	_, err = s.client.SendMessage(sctx, in)
	cancel()
	if err != nil {
		s.putBack(ctx, h)
		return fmt.Errorf("sqssource: dead letter %s: send to the dead-letter queue (the original stays and comes back): %w", h.id, err)
	}
	if failed, err := s.deleteBatch(ctx, []*handle{h}); len(failed) > 0 {
		s.stats.deleteFailures.Add(1)
		s.putBack(ctx, h)
		return fmt.Errorf("sqssource: dead letter %s was written, but deleting the original failed (it comes back and is dead-lettered again): %w",
			h.id, &BatchError{Op: "DeleteMessageBatch", Entries: failed, Err: err})
	}
	s.untrack(h)
	s.stats.deadLettered.Add(1)
	return nil
}

// redriveDelay is Config.RedriveDelay, bounded by what is left of h's
// 12-hour visibility limit.
func (s *Source) redriveDelay(h *handle) time.Duration {
	return min(max(s.cfg.RedriveDelay, 0), MaxVisibility-time.Since(h.receivedAt)-time.Second)
}

// putBack hands h back to the queue after a failed dead-letter attempt: it
// becomes visible after Config.RedriveDelay, and in strict FIFO order the
// later messages of its group go back to follow it. A failure is logged: h
// then comes back when its current visibility timeout ends.
func (s *Source) putBack(ctx context.Context, h *handle) {
	if err := s.setVisibility(ctx, h, s.redriveDelay(h)); err != nil {
		s.log.WarnContext(ctx, "handing back a message that was not dead-lettered failed; it returns after its visibility timeout",
			consumer.LogKeyID, h.id, consumer.LogKeyError, err)
	}
}

// deadLetterAttributes returns the attributes of a dead letter: the reason
// attributes and as many of the original's as fit.
func (s *Source) deadLetterAttributes(ctx context.Context, h *handle, reason error, attempts int) map[string]types.MessageAttributeValue {
	text := "unknown"
	if reason != nil {
		text = truncate(reason.Error(), maxReasonBytes)
	}
	attrs := map[string]types.MessageAttributeValue{
		AttrReason:      {DataType: aws.String("String"), StringValue: aws.String(text)},
		AttrAttempts:    {DataType: aws.String("Number"), StringValue: aws.String(strconv.Itoa(attempts))},
		AttrSourceQueue: {DataType: aws.String("String"), StringValue: aws.String(s.cfg.QueueURL)},
		AttrMessageID:   {DataType: aws.String("String"), StringValue: aws.String(h.id)},
	}
	names := make([]string, 0, len(h.raw.MessageAttributes))
	for name := range h.raw.MessageAttributes {
		if _, ours := attrs[name]; !ours {
			names = append(names, name)
		}
	}
	sortKeyFirst(names, s.cfg.KeyAttribute)
	var dropped []string
	for _, name := range names {
		if len(attrs) == maxMessageAttributes {
			dropped = append(dropped, name)
			continue
		}
		v := h.raw.MessageAttributes[name]
		attrs[name] = types.MessageAttributeValue{DataType: v.DataType, StringValue: v.StringValue, BinaryValue: v.BinaryValue}
	}
	if len(dropped) > 0 {
		s.log.WarnContext(ctx, "dead letter has too many message attributes; some were dropped", consumer.LogKeyID, h.id, "dropped", dropped)
	}
	return attrs
}

// Close stops receiving and the heartbeat, waits for the ReceiveMessage calls
// in flight, and makes every message received but not settled visible again
// at once (within Config.ReleaseTimeout), so that other consumers receive it
// without waiting for its visibility timeout. Calls to Receive blocked in
// Close's time return consumer.ErrClosed, and so do all methods afterwards.
// Close is safe to call more than once and concurrently; it always returns
// nil.
func (s *Source) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.broadcast()
		s.mu.Unlock()
		s.cancelClose()
		s.bg.Wait()
		s.release()
	})
	return nil
}

// release makes every tracked message visible again.
func (s *Source) release() {
	s.mu.Lock()
	hs := make([]*handle, 0, len(s.inflight))
	for h := range s.inflight {
		hs = append(hs, h)
	}
	clear(s.inflight)
	clear(s.active)
	s.ready = nil
	s.mu.Unlock()
	if len(hs) == 0 || s.cfg.ReleaseTimeout < 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ReleaseTimeout)
	defer cancel()
	released := 0
	for chunk := range slices.Chunk(hs, MaxBatch) {
		ok, err := s.changeVisibility(ctx, chunk, func(*handle) time.Duration { return 0 })
		released += len(ok)
		var be *BatchError
		switch {
		case errors.As(err, &be):
			// Typically handles that went stale: those messages were
			// received again or deleted already.
			s.log.DebugContext(ctx, "some messages were not released on close", consumer.LogKeyError, err)
		case err != nil:
			s.log.WarnContext(ctx, "releasing messages on close failed; they return after their visibility timeout", consumer.LogKeyError, err)
		}
	}
	s.stats.released.Add(uint64(released))
	s.log.DebugContext(ctx, "released unsettled messages", consumer.LogKeyCount, released)
}

// changeVisibility sets the visibility of up to 10 messages with one
// ChangeMessageVisibilityBatch call. It returns the handles that succeeded and
// an error describing the others.
func (s *Source) changeVisibility(ctx context.Context, hs []*handle, d func(*handle) time.Duration) ([]*handle, error) {
	entries := make([]types.ChangeMessageVisibilityBatchRequestEntry, len(hs))
	for i, h := range hs {
		entries[i] = types.ChangeMessageVisibilityBatchRequestEntry{
			Id:                aws.String(strconv.Itoa(i)),
			ReceiptHandle:     aws.String(h.receipt),
			VisibilityTimeout: seconds(d(h)),
		}
	}
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	out, err := s.client.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{
		QueueUrl: aws.String(s.cfg.QueueURL),
		Entries:  entries,
	})
	if err != nil {
		return nil, err
	}
	failed := make(map[int]EntryError, len(out.Failed))
	for _, f := range out.Failed {
		i, err := strconv.Atoi(aws.ToString(f.Id))
		if err != nil || i < 0 || i >= len(hs) {
			return nil, fmt.Errorf("sqssource: ChangeMessageVisibilityBatch answered for unknown entry %q", aws.ToString(f.Id))
		}
		failed[i] = EntryError{MessageID: hs[i].id, Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}
	}
	if len(failed) == 0 {
		return hs, nil
	}
	ok := make([]*handle, 0, len(hs)-len(failed))
	be := &BatchError{Op: "ChangeMessageVisibilityBatch"}
	for i, h := range hs {
		if e, bad := failed[i]; bad {
			be.Entries = append(be.Entries, e)
			continue
		}
		ok = append(ok, h)
	}
	return ok, be
}

// handleOf returns the handle of a message received by s.
func (s *Source) handleOf(m *consumer.Message) (*handle, error) {
	if m == nil {
		return nil, fmt.Errorf("%w: nil message", ErrForeignMessage)
	}
	h, ok := m.Handle.(*handle)
	if !ok || h.src != s {
		return nil, fmt.Errorf("%w: message %q", ErrForeignMessage, m.ID)
	}
	return h, nil
}

// untrack stops tracking hs: they are settled, and no longer extended or
// released. In strict FIFO order it unblocks their groups.
func (s *Source) untrack(hs ...*handle) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range hs {
		s.untrackLocked(h)
	}
}

// untrackLocked is untrack for one handle with s.mu held.
func (s *Source) untrackLocked(h *handle) {
	delete(s.inflight, h)
	if s.strictOrder() && s.active[h.group] == h {
		delete(s.active, h.group)
		s.broadcast()
	}
}

// giveBack stops tracking h, which goes back to the queue, and, in strict
// FIFO order, also the messages of its group waiting in the ready buffer,
// which it returns: they must go back too, to follow h.
func (s *Source) giveBack(h *handle) []*handle {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.untrackLocked(h)
	return s.detachFollowers(h)
}

// detachFollowers removes the messages of h's group from the ready buffer,
// stops tracking them and returns them (strict FIFO order only). s.mu must
// be held.
func (s *Source) detachFollowers(h *handle) []*handle {
	if !s.strictOrder() {
		return nil
	}
	var out []*handle
	keep := s.ready[:0]
	for _, m := range s.ready {
		f := m.Handle.(*handle)
		if f.group != h.group {
			keep = append(keep, m)
			continue
		}
		delete(s.inflight, f)
		out = append(out, f)
	}
	clear(s.ready[len(keep):])
	s.ready = keep
	return out
}

func (s *Source) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// requestContext bounds one settling call by Config.RequestTimeout.
func (s *Source) requestContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.cfg.RequestTimeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, s.cfg.RequestTimeout)
}

// queueAttributes reads attributes of the queue at queueURL.
func (s *Source) queueAttributes(ctx context.Context, queueURL string, names ...types.QueueAttributeName) (map[string]string, error) {
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	out, err := s.client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(queueURL), AttributeNames: names})
	if err != nil {
		return nil, fmt.Errorf("sqssource: read attributes of queue %s: %w", queueURL, err)
	}
	return out.Attributes, nil
}

// parseMaxReceiveCount reads maxReceiveCount from a RedrivePolicy, which SQS
// and its emulators render as a number or as a string.
func parseMaxReceiveCount(policy string) (int, error) {
	var p struct {
		MaxReceiveCount json.RawMessage `json:"maxReceiveCount"`
	}
	if err := json.Unmarshal([]byte(policy), &p); err != nil {
		return 0, fmt.Errorf("parse redrive policy %q: %w", policy, err)
	}
	n, err := strconv.Atoi(strings.Trim(string(p.MaxReceiveCount), `"`))
	if err != nil || n < 1 {
		return 0, fmt.Errorf("redrive policy %q has no valid maxReceiveCount", policy)
	}
	return n, nil
}

// queueName returns the last path element of a queue URL.
func queueName(queueURL string) string {
	if u, err := url.Parse(queueURL); err == nil && u.Path != "" {
		return path.Base(u.Path)
	}
	return queueURL
}

// seconds rounds d up to whole seconds for SQS, within [0, 12 h].
func seconds(d time.Duration) int32 {
	d = min(max(d, 0), MaxVisibility)
	return int32((d + time.Second - 1) / time.Second)
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}

// sortKeyFirst sorts names, with key (if present) first.
func sortKeyFirst(names []string, key string) {
	slices.SortFunc(names, func(a, b string) int {
		switch {
		case a == b:
			return 0
		case a == key:
			return -1
		case b == key:
			return 1
		}
		return strings.Compare(a, b)
	})
}

// sleep waits for d or until ctx is done; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// counters back Stats.
type counters struct {
	received, deleted, retried, deadLettered, extended, released atomic.Uint64
	receiveFailures, deleteFailures, extendFailures, expired     atomic.Uint64
}
