package demo

import (
	"errors"
	"fmt"
	"io"
	"time"
)

// Brokers and stores the demo runs on.
const (
	// BrokerKfake is an in-process Kafka-protocol cluster
	// (github.com/twmb/franz-go/pkg/kfake) run by the supervisor on
	// 127.0.0.1; workers reach it through the real kafka-go adapter.
	BrokerKfake = "kfake"
	// BrokerKafka is a real Kafka cluster at Config.KafkaBrokers.
	BrokerKafka = "kafka"
	// BrokerMemory is the in-process memsource broker. Workers run as
	// goroutines of the supervisor, and a "kill" is an abrupt stop of the
	// runner instead of a SIGKILL.
	BrokerMemory = "memory"

	// StoreSQLite is a SQLite file (dedup/sqldedup).
	StoreSQLite = "sqlite"
	// StorePostgres is PostgreSQL at Config.DatabaseURL (dedup/pgdedup).
	StorePostgres = "postgres"
)

// Defaults used by Config.WithDefaults.
const (
	DefaultMessages      = 2000
	DefaultKills         = 4
	DefaultAccounts      = 50
	DefaultBadOrders     = 5
	DefaultDuplicateRate = 0.1
	DefaultDropAcks      = 0.01
	DefaultTimeout       = 50 * time.Second
)

// ErrConfig is matched by the errors of an invalid Config.
var ErrConfig = errors.New("demo: invalid configuration")

// Config configures a demo run.
type Config struct {
	// Messages is the number of distinct valid orders the chaos producer
	// sends. Defaults to 2000.
	Messages int
	// DuplicateRate is the fraction of orders the producer sends a second
	// time, with the same idempotency key, a little later. Defaults to 0.1.
	DuplicateRate float64
	// BadOrders is the number of orders with a body that is not JSON; they
	// must end in the dead-letter topic, never in the ledger. Defaults to 5.
	BadOrders int
	// Kills is the number of times a worker is killed (SIGKILL) while
	// orders are outstanding, and restarted. Defaults to 4; negative means
	// none.
	Kills int
	// DropAcks is the fraction of acknowledgements the workers lose before
	// their last life, forcing the broker to redeliver what they had
	// already charged. Defaults to 0.01; negative means none.
	DropAcks float64
	// Seed seeds every random choice (kill moments, duplicates, lost
	// acks), so a run can be repeated. Defaults to 1.
	Seed uint64
	// Accounts is the number of accounts charged. Defaults to 50.
	Accounts int

	// Broker is BrokerKfake, BrokerKafka or BrokerMemory. Defaults to
	// BrokerKfake.
	Broker string
	// KafkaBrokers are the bootstrap addresses of BrokerKafka.
	KafkaBrokers []string
	// Store is StoreSQLite or StorePostgres. Defaults to StoreSQLite.
	Store string
	// SQLitePath is the SQLite file. Defaults to a file in a temporary
	// directory that is removed at the end.
	SQLitePath string
	// DatabaseURL is the PostgreSQL URL of StorePostgres.
	DatabaseURL string
	// Schema is the PostgreSQL schema, created if missing. Defaults to
	// "idemq_demo_<run>", dropped at the end.
	Schema string
	// SessionTimeout is the Kafka consumer group's session timeout: how
	// long a killed worker's partitions stall before its successor gets
	// them. Defaults to 1 s on kfake and 6 s (the broker's minimum) on
	// Kafka.
	SessionTimeout time.Duration

	// WorkerCommand is the program and leading arguments that start a
	// worker process; the supervisor appends the worker's flags (see
	// ParseWorkerFlags). Defaults to this executable with "worker", as
	// cmd/idemq-demo answers it.
	WorkerCommand []string
	// WorkerEnv is added to the environment of worker processes.
	WorkerEnv []string
	// Timeout bounds the whole run. Defaults to 50 s.
	Timeout time.Duration
	// Out receives the progress lines and the summary. Defaults to
	// io.Discard.
	Out io.Writer
	// Verbose passes -v to the workers (logs on stderr).
	Verbose bool
	// NoChain runs the first hop only. By default each charge also
	// publishes an "order charged" event through the transactional outbox
	// (sinks/outbox), an outbox relay publishes the events to an
	// in-process broker, and a notifier on the lease path sends each one to
	// a webhook receiver on 127.0.0.1; the proof then covers both hops.
	NoChain bool
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Messages == 0 {
		c.Messages = DefaultMessages
	}
	if c.DuplicateRate == 0 {
		c.DuplicateRate = DefaultDuplicateRate
	}
	if c.BadOrders == 0 {
		c.BadOrders = DefaultBadOrders
	}
	if c.Kills == 0 {
		c.Kills = DefaultKills
	}
	if c.DropAcks == 0 {
		c.DropAcks = DefaultDropAcks
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Accounts == 0 {
		c.Accounts = DefaultAccounts
	}
	if c.Broker == "" {
		c.Broker = BrokerKfake
	}
	if c.Store == "" {
		c.Store = StoreSQLite
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = time.Second
		if c.Broker == BrokerKafka {
			c.SessionTimeout = 6 * time.Second
		}
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Messages < 1:
		return fmt.Errorf("%w: Messages %d must be positive", ErrConfig, c.Messages)
	case c.DuplicateRate > 1:
		return fmt.Errorf("%w: DuplicateRate %g is above 1", ErrConfig, c.DuplicateRate)
	case c.DropAcks >= 0.5:
		return fmt.Errorf("%w: DropAcks %g must be below 0.5", ErrConfig, c.DropAcks)
	case c.Accounts < 1:
		return fmt.Errorf("%w: Accounts %d must be positive", ErrConfig, c.Accounts)
	case c.Broker != BrokerKfake && c.Broker != BrokerKafka && c.Broker != BrokerMemory:
		return fmt.Errorf("%w: unknown broker %q (want %s, %s or %s)", ErrConfig, c.Broker, BrokerKfake, BrokerKafka, BrokerMemory)
	case c.Broker == BrokerKafka && len(c.KafkaBrokers) == 0:
		return fmt.Errorf("%w: broker kafka needs bootstrap addresses", ErrConfig)
	case c.Store != StoreSQLite && c.Store != StorePostgres:
		return fmt.Errorf("%w: unknown store %q (want %s or %s)", ErrConfig, c.Store, StoreSQLite, StorePostgres)
	case c.Store == StorePostgres && c.DatabaseURL == "":
		return fmt.Errorf("%w: store postgres needs a database URL", ErrConfig)
	}
	return nil
}
