package sqssource

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/cfgerr"
	"github.com/idemq/idemq/sources/internal/brokerkit"
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

// Source receives messages from one SQS queue for a consumer.Runner (see
// the package documentation). The messages it returns carry the SQS
// types.Message in Raw, the MessageId in ID and ApproximateReceiveCount in
// Attempt.
//
// A Source is safe for concurrent use. Close it after the Runner using it
// has returned.
type Source struct {
	client    Client
	cfg       Config
	log       *slog.Logger
	queueName string
	broker    consumer.BrokerInfo // of every message
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

// handle is the consumer.Delivery.Handle of a message received by a Source.
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
// cfg.DeadLetterQueueURL nor a redrive policy is set, a *idemq.ConfigError
// when cfg.DeadLetterQueueURL's RedriveAllowPolicy does not allow the queue
// as a source, and a *idemq.ConfigError for each invalid field of cfg
// (after WithDefaults), all at once.
//
// The heartbeat starts at once; Close stops it.
func New(ctx context.Context, client Client, cfg Config) (*Source, error) {
	var bad cfgerr.List
	if client == nil {
		bad.Include(&idemq.ConfigError{Field: "sqssource.New(client)", Reason: "nil"})
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
		broker:    brokerInfo(cfg.QueueURL),
		inflight:  make(map[*handle]struct{}),
		active:    make(map[string]*handle),
		wake:      make(chan struct{}),
	}
	s.log = cfg.Logger.With(consumer.LogKeyQueue, s.queueName)

	attrs, err := s.queueAttributes(ctx, cfg.QueueURL, types.QueueAttributeNameFifoQueue, types.QueueAttributeNameRedrivePolicy, types.QueueAttributeNameQueueArn)
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
		dl, err := s.queueAttributes(ctx, cfg.DeadLetterQueueURL, types.QueueAttributeNameFifoQueue, types.QueueAttributeNameMaximumMessageSize,
			types.QueueAttributeNameRedriveAllowPolicy)
		if err != nil {
			return nil, err
		}
		s.deadLetterLimit = parseMaximumMessageSize(dl[string(types.QueueAttributeNameMaximumMessageSize)])
		configError := func(reason string) error {
			return &idemq.ConfigError{Field: "sqssource.Config.DeadLetterQueueURL", Reason: reason}
		}
		if dlFIFO := dl[string(types.QueueAttributeNameFifoQueue)] == "true"; dlFIFO != s.fifo {
			return nil, configError(fmt.Sprintf("FIFO is %v for the dead-letter queue but %v for the queue", dlFIFO, s.fifo))
		}
		// A dead-letter queue that allows one source queue is moved whole
		// to it by a message-move task (sqsdlq): dead letters of another
		// queue would go there too.
		allow, err := ParseRedriveAllowPolicy(dl[string(types.QueueAttributeNameRedriveAllowPolicy)])
		if err != nil {
			return nil, configError(err.Error())
		}
		if arn := attrs[string(types.QueueAttributeNameQueueArn)]; !allow.Allows(arn) {
			return nil, configError(fmt.Sprintf("the dead-letter queue's RedriveAllowPolicy does not allow queue %s as a source", arn))
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

// FIFO reports whether the queue is a FIFO queue.
func (s *Source) FIFO() bool { return s.fifo }

// MaxReceiveCount returns the maxReceiveCount of the queue's redrive policy,
// or 0 if it has none. When dead-lettering is left to the redrive policy,
// set the runner's RetryPolicy.MaxAttempts to at least this value, so that
// SQS, which keeps the message, moves it before the runner gives up on it.
func (s *Source) MaxReceiveCount() int { return s.maxReceiveCount }

// String names the source for logs (the Runner's start line): its queue's
// URL without user information or query, like "sqs
// http://127.0.0.1:9324/000000000000/orders". It holds no credentials.
func (s *Source) String() string {
	u, err := url.Parse(s.cfg.QueueURL)
	if err != nil {
		return "sqs queue=" + s.queueName
	}
	return "sqs " + (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}

// Close stops receiving and the heartbeat, cancels the ReceiveMessage calls
// in flight (messages SQS had already hidden for one come back after their
// VisibilityTimeout), and makes every message received but not settled
// visible again at once (within Config.ReleaseTimeout), so that other
// consumers receive it without waiting for its visibility timeout. Calls to
// Receive blocked in Close's time return consumer.ErrClosed, and so do all
// methods afterwards. Close is safe to call more than once and
// concurrently; it always returns nil.
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
	hs := slices.Collect(maps.Keys(s.inflight))
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

// handleOf returns the handle of a message received by s.
func (s *Source) handleOf(m *consumer.Message) (*handle, error) {
	return brokerkit.Handle(m, ErrForeignMessage, func(h *handle) bool { return h.src == s })
}

func (s *Source) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// requestContext bounds one settling call by Config.RequestTimeout.
func (s *Source) requestContext(ctx context.Context) (context.Context, context.CancelFunc) {
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

// The OpenTelemetry messaging attributes the source puts in
// consumer.Message.Broker, named as semantic conventions v1.41.0 name them.
const (
	systemSQS       = "aws_sqs"
	attrQueueURL    = "aws.sqs.queue.url"
	settleOperation = "delete"
)

// brokerInfo returns the consumer.BrokerInfo of the messages of the queue
// at queueURL: system "aws_sqs", an acknowledgement named "delete", the
// endpoint's host and port (the scheme's default port when the URL names
// none), and the queue's aws.sqs.queue.url.
func brokerInfo(queueURL string) consumer.BrokerInfo {
	b := consumer.BrokerInfo{System: systemSQS, SettleName: settleOperation,
		Attrs: []consumer.BrokerAttr{consumer.StringAttr(attrQueueURL, queueURL)}}
	u, err := url.Parse(queueURL)
	if err != nil {
		return b
	}
	b = b.WithServer(u.Host)
	if b.ServerPort == 0 {
		b.ServerPort = map[string]int{"https": 443, "http": 80}[u.Scheme]
	}
	return b
}

// queueName returns the last path element of a queue URL.
func queueName(queueURL string) string {
	if u, err := url.Parse(queueURL); err == nil && u.Path != "" {
		return path.Base(u.Path)
	}
	return queueURL
}

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
	v := attrs[string(types.QueueAttributeNameMessageRetentionPeriod)]
	if v == "" {
		return DefaultMessageRetention, nil
	}
	secs, err := strconv.ParseInt(v, 10, 64)
	if err != nil || secs < 0 {
		return 0, fmt.Errorf("sqssource: queue %s: MessageRetentionPeriod %q is not a number of seconds", s.queueName, v)
	}
	return time.Duration(secs) * time.Second, nil
}
