package kafkasource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/sources/internal/brokerkit"
	"github.com/idemq/idemq/sources/kafkasource/internal/kafkadial"
)

// Log attribute keys of the source, besides the Runner's (consumer.LogKey*).
const (
	logKeyGroup      = "group"
	logKeyPartition  = "partition"
	logKeyOffset     = "offset"
	logKeyGeneration = "generation"
	logKeyComponent  = "component"
	logKeyMember     = "member"
)

var (
	// ErrForeignMessage reports a consumer.Message that this Source did not
	// produce.
	ErrForeignMessage = errors.New("kafkasource: message was not received from this source")

	// ErrFinalCommit reports that the offset commit Close sends failed. The
	// settled messages since the last successful commit are redelivered to
	// the group, which deduplication absorbs.
	ErrFinalCommit = errors.New("kafkasource: final offset commit failed")

	// ErrSettled reports a Retry or DeadLetter of a message that was
	// already acknowledged or dead-lettered. Nothing is done.
	ErrSettled = errors.New("kafkasource: message already settled")

	// ErrUnreachable is matched by the error of New and Ping when none of
	// Config.Brokers answered; the error also carries each broker's dial or
	// request error.
	ErrUnreachable = errors.New("kafkasource: no broker reachable")
)

// Source is a consumer.Source over Kafka topics, read by a consumer group
// with kafka-go's Reader. It commits, for each partition, only the
// contiguous prefix of fetched messages that were acknowledged or
// dead-lettered, and only while the newest of them was fetched in the
// current group generation; the package documentation states the
// guarantees and the duplicate window. Create one with New; it is safe for
// concurrent use.
type Source struct {
	cfg       Config
	log       *slog.Logger
	reader    *kafka.Reader
	dlq       *kafka.Writer
	transport *kafka.Transport
	client    *kafka.Client // admin requests: metadata, offsets, configs, LeaveGroup

	// slots holds one token per message fetched, not yet settled and not
	// held behind a retried message of its key (Config.MaxInFlight).
	slots chan struct{}
	// retained holds one token per message fetched and not yet passed by
	// its partition's settled prefix (Config.MaxUncommitted).
	retained chan struct{}
	// ready holds messages to hand out. Its capacity is MaxUncommitted and
	// every unsettled message is retained and in it at most once, so sends
	// never block.
	ready chan *consumer.Message
	// errs carries the latest fetch error to Receive.
	errs chan error

	fetchCancel context.CancelFunc
	background  sync.WaitGroup // fetchLoop, leaveAbandoned and watchTopics
	closing     chan struct{}
	closeOnce   sync.Once
	closeErr    error

	// broker is the BrokerInfo of every message, but for its attributes.
	broker consumer.BrokerInfo

	// genMu serialises reads of the reader's rebalance counter, which
	// kafka-go resets on every read; gen accumulates it.
	genMu sync.Mutex
	gen   atomic.Int64

	mu       sync.Mutex // guards everything below
	closed   bool
	inFlight int // admitted and not settled
	ledger   *ledger
	timers   map[*entry]*time.Timer

	stats *counters
}

var _ consumer.Source = (*Source)(nil)

// entry is one fetched message. It is consumer.Delivery.Handle.
type entry struct {
	src          *Source
	km           kafka.Message
	id           string
	key          string
	keyErr       error // Config.KeyFunc panicked
	partitionKey string

	// What the ledger reads: offset, generation tag (see observeGeneration)
	// and hold key ("": never held) are set before ledger.record.
	offset  int64
	gen     int64
	holdKey string
	// join is the number of group generations joined when it was
	// fetched (counters.joins): once it is behind, the generation that
	// fetched it has ended, and its partition's owner fetches it again.
	join int64

	// Guarded by Source.mu.
	part     *partition // set by ledger.record
	settled  bool       // set by ledger.settle
	dropped  bool       // settled without an effect: see Source.dropLocked
	blocker  bool       // later messages of holdKey wait for this one
	slot     bool       // holds a token of Source.slots
	timerSeq uint64
	// due and attempt describe the pending redelivery, if any.
	due     time.Time
	attempt int
	// deadLetterFailures counts the consecutive failed dead-letter writes.
	deadLetterFailures int
}

// New returns a Source for cfg and starts joining its consumer group and
// fetching in the background. It validates cfg (after WithDefaults) and
// returns a *idemq.ConfigError for each invalid field, all at once. Unless
// cfg.ConnectTimeout is negative, it then checks that a broker answers,
// within ctx and ConnectTimeout, and returns ErrUnreachable if none does;
// it does not wait for the group. ctx bounds that check only: the Source
// runs until Close.
func New(ctx context.Context, cfg Config) (src *Source, err error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	stats := &counters{abandoned: make(chan string, abandonedMembers)}
	rc := kafka.ReaderConfig{
		Brokers:           cfg.Brokers,
		GroupID:           cfg.GroupID,
		Dialer:            cfg.Dialer,
		QueueCapacity:     cfg.QueueCapacity,
		MinBytes:          cfg.MinBytes,
		MaxBytes:          cfg.MaxBytes,
		MaxWait:           cfg.MaxWait,
		ReadLagInterval:   -1,
		HeartbeatInterval: cfg.HeartbeatInterval,
		CommitInterval:    cfg.CommitInterval, // kafka-go's commit loop; see commit.go
		SessionTimeout:    cfg.SessionTimeout,
		RebalanceTimeout:  cfg.RebalanceTimeout,
		JoinGroupBackoff:  cfg.JoinGroupBackoff,
		ReadBackoffMax:    maxFetchBackoff, // a partition reader's reconnects (kafka-go: 1 s)
		StartOffset:       cfg.StartOffset,
		IsolationLevel:    cfg.IsolationLevel,
		Logger:            readerLogger(cfg.Logger, stats),
		ErrorLogger:       readerErrorLogger(cfg.Logger, stats),
	}
	if len(cfg.Topics) == 1 {
		rc.Topic = cfg.Topics[0]
	} else {
		rc.GroupTopics = cfg.Topics
	}
	if err := rc.Validate(); err != nil {
		return nil, &idemq.ConfigError{Field: "kafkasource.Config", Reason: "rejected by kafka-go", Err: err}
	}
	transport := kafkadial.Transport(cfg.Dialer)
	client := &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Transport: transport}
	var missing []string // topics that do not exist (yet): see watchTopics
	checked := false
	if cfg.ConnectTimeout >= 0 {
		pctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
		err := ping(pctx, cfg)
		if err == nil {
			// Before the reader starts: its group's metadata requests
			// may create the topics on brokers that auto-create them.
			var merr error
			missing, merr = missingTopics(pctx, client, cfg.Topics)
			checked = merr == nil
		}
		cancel()
		if err != nil {
			return nil, err
		}
	}

	// kafka.NewReader panics on configurations it rejects; report them.
	defer func() {
		if v := recover(); v != nil {
			src, err = nil, &idemq.ConfigError{Field: "kafkasource.Config", Reason: fmt.Sprint(v)}
		}
	}()
	reader := kafka.NewReader(rc)

	s := &Source{
		cfg:       cfg,
		log:       cfg.Logger.With(logKeyGroup, cfg.GroupID),
		reader:    reader,
		transport: transport,
		client:    client,
		broker:    brokerInfo(cfg.Brokers[0]),
		dlq: &kafka.Writer{
			Addr:         kafka.TCP(cfg.Brokers...),
			Balancer:     &kafka.Hash{},
			RequiredAcks: kafka.RequireAll,
			BatchTimeout: time.Millisecond,
			Transport:    transport,
			Logger:       kafkaLogger(cfg.Logger, slog.LevelDebug),
			ErrorLogger:  kafkaLogger(cfg.Logger, slog.LevelWarn),
		},
		slots:    make(chan struct{}, cfg.MaxInFlight),
		retained: make(chan struct{}, cfg.MaxUncommitted),
		ready:    make(chan *consumer.Message, cfg.MaxUncommitted),
		errs:     make(chan error, 1),
		closing:  make(chan struct{}),
		ledger:   newLedger(),
		timers:   make(map[*entry]*time.Timer),
		stats:    stats,
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.fetchCancel = cancel
	s.background.Go(func() { s.fetchLoop(ctx) })
	s.background.Go(func() { s.leaveAbandoned(ctx) })
	s.background.Go(func() { s.watchTopics(ctx, missing, checked) })
	return s, nil
}

// String names the source for logs (the Runner's start line): its
// bootstrap addresses, topics and consumer group, like "kafka
// 127.0.0.1:9092 topics=orders group=billing". It holds no credentials.
func (s *Source) String() string {
	return "kafka " + strings.Join(s.cfg.Brokers, ",") + " topics=" + strings.Join(s.cfg.Topics, ",") + " group=" + s.cfg.GroupID
}

// Ping checks that at least one of Config.Brokers accepts a connection and
// answers a metadata request before ctx is done. New does the same check,
// bounded by Config.ConnectTimeout; Ping serves health checks later on. A
// nil error says nothing about the consumer group or the topics.
func (s *Source) Ping(ctx context.Context) error { return ping(ctx, s.cfg) }

// ping dials the brokers of cfg in turn until one answers a metadata request.
func ping(ctx context.Context, cfg Config) error {
	errs := make([]error, 0, len(cfg.Brokers))
	for _, addr := range cfg.Brokers {
		err := pingOne(ctx, cfg.Dialer, addr)
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
		if ctx.Err() != nil {
			break
		}
	}
	return fmt.Errorf("%w (%d broker(s) tried): %w", ErrUnreachable, len(errs), errors.Join(errs...))
}

func pingOne(ctx context.Context, d *kafka.Dialer, addr string) error {
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	} else {
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	}
	if _, err := conn.Brokers(); err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	return nil
}

// Close stops fetching, commits the settled prefixes (bounded by
// Config.CommitTimeout; a failure is returned), leaves the consumer group and
// closes the connections. Messages fetched and not settled, including those waiting for
// a retry, are not committed: the group hands them out again. Close is safe to
// call more than once and concurrently with the other methods, which then
// fail with consumer.ErrClosed; every call returns the first call's result.
func (s *Source) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}

func (s *Source) close() error {
	s.mu.Lock()
	s.closed = true
	close(s.closing)
	for e, t := range s.timers {
		t.Stop()
		delete(s.timers, e)
	}
	s.mu.Unlock()

	s.fetchCancel()
	s.background.Wait()

	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.CommitTimeout)
	defer cancel()
	if err := s.requestCommit(ctx); err != nil {
		errs = append(errs, err)
	}
	// Closing the reader ends its generation, and kafka-go's commit loop
	// sends the offsets requested since its last tick before it returns.
	failures := s.stats.commitFailures.Load()
	if err := s.reader.Close(); err != nil {
		errs = append(errs, fmt.Errorf("kafkasource: close reader: %w", err))
	}
	if s.stats.commitFailures.Load() != failures {
		errs = append(errs, ErrFinalCommit)
	}
	if err := s.dlq.Close(); err != nil {
		errs = append(errs, fmt.Errorf("kafkasource: close dead-letter writer: %w", err))
	}
	s.transport.CloseIdleConnections()
	return errors.Join(errs...)
}

func (s *Source) entryOf(m *consumer.Message) (*entry, error) {
	return brokerkit.Handle(m, ErrForeignMessage, func(e *entry) bool { return e.src == s })
}

// kafkaLogger adapts l to kafka-go's Logger at level, or returns nil (no
// logging, no formatting cost) when l does not log at that level.
func kafkaLogger(l *slog.Logger, level slog.Level) kafka.Logger {
	if !l.Enabled(context.Background(), level) {
		return nil
	}
	return kafka.LoggerFunc(func(format string, args ...any) {
		l.Log(context.Background(), level, strings.TrimSpace(fmt.Sprintf(format, args...)), logKeyComponent, "kafka-go")
	})
}
