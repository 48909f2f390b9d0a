package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/cfgerr"
)

// ReplySuffix ends the id of a reply: a request's reply id is
// consumer.IdempotencyKey of the request (the replying consumer's Name and
// the request's deduplication key) followed by ReplySuffix. The ids Publish
// derives end in "/" and a number, so a reply id never collides with them.
const ReplySuffix = "/reply"

// ReplyID returns the id of the reply to the request being handled in ctx
// (a handler's ctx, or msg.KeyContext(ctx)): the same for every copy of
// the request, so the requester's consumer, whose deduplication key is the
// reply's idempotency key, absorbs repeats. ok is false when ctx carries no
// request.
func ReplyID(ctx context.Context) (id string, ok bool) {
	k, ok := consumer.IdempotencyKey(ctx)
	if !ok {
		return "", false
	}
	return k + ReplySuffix, true
}

// Reply is Schema("").Reply.
func Reply(h func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) ([]byte, error)) consumer.TxHandler[pgx.Tx] {
	return Schema("").Reply(h)
}

// Reply adapts a transactional handler that answers requests. It is
// consumer.TxResult (h's result is stored with the request's record, in
// h's transaction) and, when the request asks for a reply (msg.ReplyTo is
// set), it also publishes the result to msg.ReplyTo through the outbox in
// the same transaction, so the reply exists if and only if the effect
// committed.
//
// The reply's id (its idempotency key on every broker) is ReplyID; its
// header HeaderCorrelationID (and, on RabbitMQ, its correlation_id
// property) carries msg.CorrelationID; its body is the result; it has no
// partition key. On RabbitMQ, ReplyTo names a queue, reached through the
// default exchange; on Kafka a topic, on SQS a queue URL or name. A
// Resender re-sends it for a duplicate request, which never runs h.
//
// A reply goes only to the ReplyTo of the request that wrote it: if its row
// exists for another destination (the request's record expired and a new
// copy asks for the reply elsewhere), the handler fails permanently with
// ErrReplyToMismatch, so its writes roll back and the message is
// dead-lettered.
func (s Schema) Reply(h func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) ([]byte, error)) consumer.TxHandler[pgx.Tx] {
	return consumer.TxResult(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) ([]byte, error) {
		b, err := h(ctx, tx, msg)
		if err != nil || msg.ReplyTo == "" {
			return b, err
		}
		id, ok := ReplyID(ctx)
		if !ok {
			return nil, ErrNoID
		}
		if err := s.putReply(ctx, tx, id, msg, b, false); err != nil {
			if errors.Is(err, ErrReplyToMismatch) {
				return nil, consumer.Permanent(err) // the same request would be refused again
			}
			return nil, err
		}
		return b, nil
	})
}

// ErrReplyToMismatch is the error of a reply whose request names another
// ReplyTo than the request that wrote the reply's row: a reply goes only
// where the first request asked for it. Reply fails with it (permanently:
// the message is dead-lettered, its effect rolled back); a Resender logs
// it and re-sends nothing.
var ErrReplyToMismatch = errors.New("outbox: the reply exists for another ReplyTo")

// replyToMismatch is an ErrReplyToMismatch naming both destinations.
type replyToMismatch struct {
	id, replyTo, first string
}

func (e *replyToMismatch) Error() string {
	return fmt.Sprintf("%v: reply %s goes to %q, this request asks for it at %q", ErrReplyToMismatch, e.id, e.first, e.replyTo)
}

func (e *replyToMismatch) Unwrap() error { return ErrReplyToMismatch }

// replySQL inserts a reply's row, or re-arms it when the id exists for the
// same destination: the row becomes pending again, with the latest
// request's correlation header, and keeps its body (the reply as first
// committed, which the stored result repeats). A row for another
// destination is left alone and no row is returned. A row a relay is
// publishing is locked by its claim: the statement waits for the relay to
// finish, then re-arms it. The outbox's insert trigger fires for both,
// waking the relays. It runs under replyLockSQL: a table partitioned by
// day has no unique index on id, and the lock keeps a second reply to the
// id from inserting a row of its own.
func replySQL(table string) string {
	return `WITH u AS (` + rearmSQL(table) + `),
i AS (INSERT INTO ` + table + ` (id, source_key, destination, partition_key, routing_key, headers, body)
SELECT $1, NULL, $2, '', $3, $4, $5 WHERE NOT EXISTS (SELECT FROM ` + table + ` WHERE id = $1)
RETURNING id)
SELECT id FROM u UNION ALL SELECT id FROM i`
}

// replyLockSQL takes the transaction's lock on a reply's id ($1) in table
// ($2), which replySQL runs under.
const replyLockSQL = `SELECT 1 FROM (SELECT pg_advisory_xact_lock(hashtext('idemq.outbox.reply:' || $2::text || ':' || $1::text))) AS l`

// rearmSQL re-arms a reply's row for the same destination as replySQL
// does, without inserting one. An update fires no insert trigger: the
// relays find the row at their next poll (Config.PollInterval).
func rearmSQL(table string) string {
	return `UPDATE ` + table + ` SET headers = $4,
    state = 0, attempts = 0, last_error = NULL, next_attempt_at = NULL, sent_at = NULL
WHERE id = $1 AND destination = $2 AND routing_key = $3
RETURNING id`
}

// putReply writes the reply to msg, id and body, with db. With rearmOnly
// it only re-arms an existing row (a duplicate whose record holds no
// result: its reply's body is not known). A row of id for another
// destination than msg.ReplyTo is left alone: putReply returns a
// *replyToMismatch.
func (s Schema) putReply(ctx context.Context, db PgxQuerier, id string, msg *consumer.Message, body []byte, rearmOnly bool) error {
	dest, routingKey := msg.ReplyTo, ""
	if msg.Broker.System == "rabbitmq" {
		dest, routingKey = "", msg.ReplyTo // reply_to is a queue: the default exchange routes to it
	}
	var h map[string]string
	if msg.CorrelationID != "" {
		h = map[string]string{consumer.HeaderCorrelationID: msg.CorrelationID}
	}
	headers := encodeHeaders(ctx, h) // with the trace context, as Publish does
	if body == nil {
		body = []byte{}
	}
	var err error
	if rearmOnly {
		err = db.QueryRow(ctx, rearmSQL(s.table()), id, dest, routingKey, headers).Scan(new(string))
	} else if err = db.QueryRow(ctx, replyLockSQL, id, s.table()).Scan(new(int)); err == nil {
		err = db.QueryRow(ctx, replySQL(s.table()), id, dest, routingKey, headers, body).Scan(new(string))
	}
	if errors.Is(err, pgx.ErrNoRows) {
		// No row for this destination: another destination's row, or (when
		// re-arming) no row at all.
		var firstDest, firstKey string
		err = db.QueryRow(ctx, `SELECT destination, routing_key FROM `+s.table()+` WHERE id = $1`, id).Scan(&firstDest, &firstKey)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return nil
		case err == nil: // a RabbitMQ queue is the routing key of the default exchange
			return &replyToMismatch{id: id, replyTo: msg.ReplyTo, first: cmp.Or(firstDest, firstKey)}
		}
	}
	if err != nil {
		return fmt.Errorf("outbox: reply to %q: %w", msg.ReplyTo, err)
	}
	return nil
}

// ResendConfig configures a Resender.
type ResendConfig struct {
	// Schema is the PostgreSQL schema of the outbox table, as given to
	// Schema.Reply. Defaults to "" (search_path).
	Schema Schema
	// Timeout bounds one re-send. Defaults to 5 s.
	Timeout time.Duration
	// Logger receives a warning for each re-send that failed. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// Resender re-sends the stored reply of a duplicate request. Install it in
// consumer.Config.Hooks of the runner whose handler is wrapped by Reply: as
// a consumer.HookClaimed it runs for every duplicate, on the lane, before
// the duplicate is acknowledged, so a worker that dies in between re-sends
// on the redelivery. (A duplicate never reaches the handler, so Reply
// cannot.)
//
// For a duplicate with ReplyTo whose record holds a result
// (consumer.StoredResult), one statement puts the reply's row (id ReplyID)
// back to pending with the duplicate's CorrelationID, or inserts it again
// from the stored result if the relay's cleanup deleted it; a record
// without a result only re-arms a row that exists. Every copy of the reply
// has the same id and body, which the requester's idemq consumer absorbs,
// and repeats that arrive while it is pending coalesce into one publish.
// A duplicate whose ReplyTo differs from the row's destination is refused
// (one WARN line; the row is left as it is): while the row exists, the
// reply goes only where the first request asked for it.
//
// A re-send that fails within Timeout is logged and not retried: the first
// reply exists, since its effect committed. Each re-send costs the lane one
// database round trip. A Resender is safe for concurrent use.
type Resender struct {
	db  PgxQuerier
	cfg ResendConfig
}

var _ consumer.HookClaimed = (*Resender)(nil)

// NewResender returns a Resender writing with db (a *pgxpool.Pool: each
// re-send is one autocommitted statement). It fails with idemq.ErrInvalidConfig
// when db is nil or cfg.Timeout is negative.
func NewResender(db PgxQuerier, cfg ResendConfig) (*Resender, error) {
	cfg.Timeout = cmp.Or(cfg.Timeout, 5*time.Second)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	var l cfgerr.List
	if cfgerr.IsNil(db) {
		l.Add("db", "required")
	}
	l.Prefix = "outbox.ResendConfig."
	l.NotNegative("Timeout", cfg.Timeout)
	if err := l.Err(); err != nil {
		return nil, err
	}
	return &Resender{db: db, cfg: cfg}, nil
}

// OnClaimed re-sends the stored reply of m when m is a duplicate request
// asking for a reply; see Resender.
func (r *Resender) OnClaimed(ctx context.Context, m *consumer.Message, c consumer.ClaimInfo) {
	if c.State != dedup.StateDone || m.ReplyTo == "" {
		return
	}
	result, replayed, ok := consumer.StoredResult(m)
	if !ok || !replayed {
		return
	}
	id, ok := ReplyID(m.KeyContext(ctx))
	if !ok {
		r.cfg.Logger.WarnContext(ctx, "outbox: reply not re-sent: the request's key is unknown", slog.String(consumer.LogKeyID, m.ID))
		return
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	// A record without a result (a nil result, or written before results
	// were stored) does not say what the reply was: re-arm its row if the
	// relay's cleanup left it, never invent an empty reply.
	err := r.cfg.Schema.putReply(ctx, r.db, id, m, result, result == nil)
	var mismatch *replyToMismatch
	switch {
	case errors.As(err, &mismatch):
		r.cfg.Logger.WarnContext(ctx, "outbox: reply not re-sent: the duplicate asks for it at another ReplyTo than the request that ran",
			slog.String(logKeyReplyID, id), slog.String(logKeyReplyTo, m.ReplyTo), slog.String(logKeyDestination, mismatch.first))
	case err != nil:
		r.cfg.Logger.WarnContext(ctx, "outbox: reply not re-sent", slog.String(logKeyReplyID, id), slog.Any(consumer.LogKeyError, err))
	}
}

// CheckSchema implements dedup.SchemaChecker, so that a Runner with the
// Resender in its Hooks refuses to start without the outbox table: one
// statement that reads no row checks that the table exists with the
// columns of the latest migration. It returns a *dedup.SchemaError (naming
// dedup/migrate and `idemq migrate --outbox`) when it does not, the database's
// error when it could not be asked.
func (r *Resender) CheckSchema(ctx context.Context) error {
	t := r.cfg.Schema.table()
	var one int
	err := r.db.QueryRow(ctx, `SELECT 1 FROM (SELECT seq, id, source_key, destination, partition_key, routing_key, headers, body, state, attempts, next_attempt_at, sent_at FROM `+t+` WHERE false) AS o`).Scan(&one)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000" || pgErr.Code == "42703"):
		return &dedup.SchemaError{Table: t, Migrate: "create it with dedup/migrate's Outbox line (or run `idemq migrate --outbox`)", Err: err}
	case err != nil:
		return fmt.Errorf("outbox: check schema: %w", err)
	}
	return nil
}

var _ dedup.SchemaChecker = (*Resender)(nil)
