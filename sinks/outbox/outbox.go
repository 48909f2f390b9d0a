package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/migrate"
)

// Table is the name of the outbox table that the migrations create and
// Publish and the relay use. Without a Schema (the default) it is found
// through the connection's search_path on PostgreSQL.
const Table = migrate.OutboxTable

// Schema is the PostgreSQL schema that holds the outbox table. The empty
// Schema, the default of the package-level functions and of
// Config.Schema, finds the table through the connection's search_path.
// Its methods are the package-level functions in that schema:
//
//	outbox.Schema("billing").Publish(ctx, tx, msg)
//
// Any name is quoted as an identifier, so it is used exactly as written.
// SQLite has no schemas: use the empty Schema there.
type Schema string

// table returns the outbox table's name in s, quoted when s is set.
func (s Schema) table() string {
	if s == "" {
		return Table
	}
	return pgx.Identifier{string(s), Table}.Sanitize()
}

// Channel is the PostgreSQL notification channel that an insert into the
// outbox table signals (through a trigger, at commit) and a Relay listens on.
const Channel = "idemq_outbox"

// HeaderIdempotencyKey is the Kafka header and the SQS message attribute that
// carry a message's stable id; it is the name kafkasource reads by default
// (kafkasource.DefaultKeyHeader) and amqpsource reads before the message-id
// property (amqpsource.DefaultKeyHeader). RabbitMQ messages also carry the
// id as their message-id property.
const HeaderIdempotencyKey = "idempotency-key"

// HeaderPartitionKey is the SQS message attribute that carries
// Message.Key on standard queues (on FIFO queues the key is the
// MessageGroupId). Configure sqssource's PartitionKeyAttribute with it.
const HeaderPartitionKey = "partition-key"

// ErrNoID is returned by Publish for a message without an explicit ID
// outside a consumer's handler (a ctx with no consumer.IdempotencyKey),
// where no stable id can be derived.
var ErrNoID = errors.New("outbox: message has no ID and ctx has no consuming message's idempotency key")

// Message is one message to publish after the transaction commits.
type Message struct {
	// ID is the stable message id the relay sends as the idempotency key
	// (the Kafka and SQS "idempotency-key" header or attribute, the AMQP
	// message-id). Leave it empty inside a handler: Publish derives it from
	// the consuming message's idempotency key and the publish's index. It is
	// required outside a handler.
	ID string
	// Destination is the Kafka topic, the SQS queue URL (or queue name) or
	// the RabbitMQ exchange ("" is the default exchange).
	Destination string
	// Key is the partition key: the Kafka message key, the SQS
	// MessageGroupId (FIFO) or "partition-key" attribute (standard), and
	// the RabbitMQ routing key unless RoutingKey is set. The relay
	// publishes the messages of one non-empty Key in the order they were
	// published, one at a time; messages without a Key are not ordered.
	Key string
	// RoutingKey is the RabbitMQ routing key when it differs from Key, for
	// example the queue's name when publishing through the default
	// exchange: the relay then orders by Key, not by the routing key, so
	// that messages of different Keys go out in parallel. Empty (the
	// default) routes with Key. Kafka and SQS ignore it.
	RoutingKey string
	// Headers are sent as Kafka headers, SQS string attributes or AMQP
	// headers. SQS refuses characters outside the XML 1.0 range, so sqsoutbox
	// writes those (control characters, invalid UTF-8) as Go escapes them
	// ("\x01"), as it does for Key and ID. When ctx carries a span
	// (consumer/otelidemq's handler span), Publish adds its W3C traceparent
	// (and tracestate) unless Headers has a traceparent already; to carry
	// another format or baggage, inject it into Headers first (for example
	// otelidemq.Inject(ctx, propagation.MapCarrier(headers))).
	Headers map[string]string
	// Body is the payload.
	Body []byte
}

// PgxQuerier is what Publish needs of a pgx transaction: pgx.Tx fits, and
// so do *pgx.Conn, *pgxpool.Pool and *pgxpool.Conn (outside a
// transaction).
type PgxQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// SQLQuerier is what PublishSQL needs of a database/sql transaction:
// *sql.Tx fits, and so do *sql.Conn and *sql.DB (outside a transaction).
type SQLQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// insertSQL returns the statement that inserts one row into table and
// returns its id, in both dialects. Without an explicit id ($1 NULL), the id
// is the source key, "/" and the number of rows the source key already has
// in the transaction's view: the publish's index within the handler run. A
// rolled-back run leaves no row, so its rerun numbers its publishes from 0
// again and gets the same ids.
func insertSQL(table string) string {
	return `INSERT INTO ` + table + ` (id, source_key, destination, partition_key, routing_key, headers, body)
SELECT COALESCE(CAST($1 AS TEXT), CAST($2 AS TEXT) || '/' || CAST((SELECT count(*) FROM ` + table + ` WHERE source_key = CAST($2 AS TEXT)) AS TEXT)),
       CAST($2 AS TEXT), $3, $4, $5, $6, $7
RETURNING id`
}

// Publish writes m to the outbox table in tx, the handler's pgx
// transaction: it is published by a Relay after tx commits, and never if tx
// rolls back. PublishSQL is the same for a database/sql transaction.
//
// Publish returns the message's stable id. Unless m.ID is set, it is
// consumer.IdempotencyKey(ctx) + "/" + n, where n counts the messages this
// consuming message published before in the same transaction (0, 1, 2...).
// The count is read from the table, so it follows the transaction: a handler
// that runs again after a rollback (or a rollback to a savepoint) publishes
// the same ids in the same order. Use an explicit ID when the order of
// publishes may change between runs. In a consumer.TransactionalBatch
// handler, ctx has no key of its own: pass msg.KeyContext(ctx) for each
// message of the batch.
//
// Outside a handler m.ID is required (ErrNoID). Publishing an ID twice
// fails with the database's unique violation. Publish uses the table found
// through search_path; Schema.Publish names its schema.
func Publish(ctx context.Context, tx PgxQuerier, m Message) (string, error) {
	return Schema("").Publish(ctx, tx, m)
}

// PublishSQL is Publish for a database/sql transaction, on PostgreSQL or
// SQLite.
func PublishSQL(ctx context.Context, tx SQLQuerier, m Message) (string, error) {
	return Schema("").PublishSQL(ctx, tx, m)
}

// Publish is the package-level Publish with the table in schema s.
func (s Schema) Publish(ctx context.Context, tx PgxQuerier, m Message) (string, error) {
	return s.insert(ctx, m, func(q string, args ...any) pgx.Row { return tx.QueryRow(ctx, q, args...) })
}

// PublishSQL is the package-level PublishSQL with the table in schema s.
func (s Schema) PublishSQL(ctx context.Context, tx SQLQuerier, m Message) (string, error) {
	return s.insert(ctx, m, func(q string, args ...any) pgx.Row { return tx.QueryRowContext(ctx, q, args...) })
}

// insert runs insertSQL for m with queryRow (a *sql.Row is a pgx.Row too)
// and returns the row's id.
func (s Schema) insert(ctx context.Context, m Message, queryRow func(q string, args ...any) pgx.Row) (string, error) {
	var sourceKey *string
	var id *string
	if m.ID != "" {
		id = &m.ID
	} else {
		k, ok := consumer.IdempotencyKey(ctx)
		if !ok {
			return "", ErrNoID
		}
		sourceKey = &k
	}
	if m.Body == nil {
		m.Body = []byte{}
	}
	var got string
	if err := queryRow(insertSQL(s.table()), id, sourceKey, m.Destination, m.Key, m.RoutingKey, encodeHeaders(ctx, m.Headers), m.Body).Scan(&got); err != nil {
		return "", fmt.Errorf("outbox: publish to %q: %w", m.Destination, err)
	}
	return got, nil
}

// encodeHeaders returns h as the JSON of the headers column, with the W3C
// trace context of ctx's span added unless h has a traceparent already:
// the handler's span travels with the row, so the downstream consumer's
// spans join its trace. h itself is left as it is.
func encodeHeaders(ctx context.Context, h map[string]string) string {
	if _, set := h["traceparent"]; !set && trace.SpanContextFromContext(ctx).IsValid() {
		h = maps.Clone(h)
		if h == nil {
			h = map[string]string{}
		}
		propagation.TraceContext{}.Inject(ctx, propagation.MapCarrier(h))
	}
	if len(h) == 0 {
		return "{}"
	}
	b, _ := json.Marshal(h) // a map of strings always encodes
	return string(b)
}
