package console

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer/dlq"
	"github.com/idemq/idemq/dedup"
)

// Queue is a dead-letter topic or queue the console shows, replays and
// purges.
type Queue struct {
	// Name names the queue in the console's pages and URLs: letters,
	// digits, '.', '-' and '_', unique among Config.Queues. Required.
	Name string
	// Broker is the broker's kind as the pages show it ("kafka", "sqs",
	// "rabbitmq"). Defaults to "".
	Broker string
	// Open opens the dead-letter store. The console opens it for each
	// listing, replay or purge, closes it afterwards, and never uses one
	// store from two goroutines. Required.
	Open func(ctx context.Context) (dlq.Broker, error)
	// Failures and Scope are dlq.Options.Failures and dlq.Options.Scope for
	// the console's replays: the runner's store driver and Config.Name, to
	// forget each replayed key's failure count. Default to nil and "".
	Failures interface {
		ForgetFailures(ctx context.Context, scope, key string) error
	}
	Scope string
}

// Outbox reads the transactional outbox's table. `idemq console` adapts
// outbox.Schema.Counts to it.
type Outbox interface {
	// OutboxStats counts the outbox's rows now. It must be safe for
	// concurrent use.
	OutboxStats(ctx context.Context) (OutboxStats, error)
}

// OutboxStats describes the outbox's table.
type OutboxStats struct {
	// Table is the table's name as the pages show it.
	Table string
	// Pending rows wait to be published; Failing are the pending rows
	// whose last publish failed; Parked rows gave up; Sent rows were
	// confirmed and wait for the cleanup.
	Pending, Failing, Parked, Sent int64
	// OldestPending is the age of the oldest pending row (0 without one):
	// the relay's lag, how late the next publish is. OldestParked is the
	// age of the oldest parked row.
	OldestPending, OldestParked time.Duration
	// SentLastMinute is the number of rows confirmed in the last minute;
	// negative when unknown.
	SentLastMinute int64
}

// Dedup reads a dedup store's table. `idemq console` adapts
// sqldedup.Store.Report and the table's catalog to it.
type Dedup interface {
	// DedupStats reads the store's table now. It must be safe for
	// concurrent use.
	DedupStats(ctx context.Context) (DedupStats, error)
}

// DedupStats describes a dedup store's table.
type DedupStats struct {
	// TableReport holds the records per scope, their ages and the
	// table's size.
	dedup.TableReport
	// Retention is how long a record deduplicates (the store's
	// Retention); 0 when unknown.
	Retention time.Duration
	// Results counts, per scope, the records that store a result; nil
	// when unknown.
	Results map[string]int64
	// Failing counts, per scope, the keys with a failure count (handlers
	// that failed and will be retried or dead-lettered); nil when unknown.
	Failing map[string]int64
	// Claims are the claims in progress per scope, nil when the store
	// cannot see them: on the transactional path a claim is an
	// uncommitted row that other sessions do not see; a lease store's
	// leases are claims.
	Claims map[string]Claims
	// Claiming counts, for the whole table, the transactions claiming
	// now: on the transactional path those that hold a write lock on it
	// and have not committed, each with one claim or a batch of them, of
	// scopes no other session can tell. Nil when unknown.
	Claiming *Claiming
	// Partitions are the table's partitions, nil when it has none (or the
	// store does not report them).
	Partitions []Partition
}

// Claims are the claims in progress of one scope.
type Claims struct {
	// Count is their number; Oldest is when the oldest was made.
	Count  int64
	Oldest time.Time
}

// Claiming counts the open transactions that write to a dedup table.
type Claiming struct {
	// Transactions is their number; Oldest is when the oldest of those
	// whose start the reader may see began (zero when none).
	Transactions int64
	Oldest       time.Time
	// Hidden is how many of Transactions belong to sessions whose start
	// the reader may not see (PostgreSQL shows another role's only to
	// members of pg_read_all_stats); Oldest leaves them out.
	Hidden int64
}

// Partition is one partition of a partitioned table.
type Partition struct {
	// Name is the partition's table; Bound its range as the database
	// states it.
	Name, Bound string
	// Rows is the database's estimate of its rows; Bytes its size on disk.
	Rows, Bytes int64
}

// Worker is a runner the console watches: it scrapes URL, a runner's
// readiness endpoint (consumer.HealthHandler's readyz, or a
// WorkerReporter's handler, which adds the in-flight count, the lag and
// the last error).
type Worker struct {
	// Name names it in the pages. Required, unique among Config.Workers.
	Name string
	// URL is the endpoint, such as http://10.0.0.5:8080/health/readyz.
	// Required. Pages show it with its password, path and query masked.
	URL string
}

// Config configures a Console. Only Queues, Outbox, Dedup and Workers
// choose what it shows; each may be empty.
type Config struct {
	// Queues are the dead-letter stores shown. Defaults to none.
	Queues []Queue
	// Outbox is the outbox shown. Defaults to nil: no outbox page.
	Outbox Outbox
	// Dedup is the dedup store shown. Defaults to nil: no dedup page.
	Dedup Dedup
	// Workers are the runners shown. Defaults to none.
	Workers []Worker
	// Token authorises every mutation (replay, purge): a browser signs in
	// with it once; a script sends "Authorization: Bearer TOKEN". Defaults
	// to "": every mutation is refused, as with ReadOnly.
	Token string
	// ReadOnly refuses every mutation, whatever the token, and hides their
	// buttons. Defaults to false.
	ReadOnly bool
	// Prefix is the path the console is mounted under, such as "/idemq"
	// (no trailing slash), used in its links, forms and cookies; the
	// handler also answers requests whose path lacks it (a reverse proxy
	// that strips it). Defaults to "": mounted at the root.
	Prefix string
	// DSNs are the DSNs and broker URLs the console's stores were opened
	// with: their passwords and secret parameters are masked in every
	// page and log line (an error quoting a DSN). Defaults to none.
	DSNs []string
	// Logger receives a line per mutation and per failure to read a
	// store. Defaults to slog.Default().
	Logger *slog.Logger
	// ScrapeTimeout bounds each scrape of a worker: a worker that does not
	// answer within it is shown as gone. Defaults to 2 s.
	ScrapeTimeout time.Duration
}

// listLimit is the most dead letters of a queue a page reads, groups and
// offers to select; a group's replay covers the letters read.
const listLimit = 1000

// queueName is the form of a Queue.Name.
var queueName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,200}$`)

// withDefaults validates c and fills its zero values.
func (c Config) withDefaults() (Config, error) {
	seen := map[string]bool{}
	for i, q := range c.Queues {
		field := fmt.Sprintf("console.Config.Queues[%d]", i)
		switch {
		case !queueName.MatchString(q.Name):
			return c, &idemq.ConfigError{Field: field + ".Name", Reason: fmt.Sprintf("%q: want 1 to 200 letters, digits, '.', '-' or '_'", q.Name)}
		case seen["q/"+q.Name]:
			return c, &idemq.ConfigError{Field: field + ".Name", Reason: fmt.Sprintf("%q names two queues", q.Name)}
		case q.Open == nil:
			return c, &idemq.ConfigError{Field: field + ".Open", Reason: "required"}
		}
		seen["q/"+q.Name] = true
	}
	for i, w := range c.Workers {
		field := fmt.Sprintf("console.Config.Workers[%d]", i)
		switch {
		case w.Name == "":
			return c, &idemq.ConfigError{Field: field + ".Name", Reason: "required"}
		case seen["w/"+w.Name]:
			return c, &idemq.ConfigError{Field: field + ".Name", Reason: fmt.Sprintf("%q names two workers", w.Name)}
		case !strings.HasPrefix(w.URL, "http://") && !strings.HasPrefix(w.URL, "https://"):
			return c, &idemq.ConfigError{Field: field + ".URL", Reason: "want an http:// or https:// URL"}
		}
		seen["w/"+w.Name] = true
	}
	if c.Prefix != "" && (!strings.HasPrefix(c.Prefix, "/") || strings.HasSuffix(c.Prefix, "/") || strings.ContainsAny(c.Prefix, `"'<>?# `)) {
		return c, &idemq.ConfigError{Field: "console.Config.Prefix", Reason: fmt.Sprintf("%q: want a path such as /idemq, without a trailing slash", c.Prefix)}
	}
	if c.ScrapeTimeout < 0 {
		return c, &idemq.ConfigError{Field: "console.Config.ScrapeTimeout", Reason: "must not be negative"}
	}
	c.Logger = cmp.Or(c.Logger, slog.Default())
	c.ScrapeTimeout = cmp.Or(c.ScrapeTimeout, 2*time.Second)
	return c, nil
}
