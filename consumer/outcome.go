package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/idemq/idemq/dedup"
)

// ErrResultTooLarge is matched by the dead-letter reason of a message whose
// handler returned a result larger than Config.MaxResultBytes (or than the
// lease store's own limit). It is dedup.ErrResultTooLarge. It is never
// retried: the same handler would return the same result again.
var ErrResultTooLarge = dedup.ErrResultTooLarge

// ErrResultUnsupported is matched by the dead-letter reason of a message
// whose handler returned a result that the path's store cannot keep (it
// implements neither dedup.ResultStorer nor dedup.ResultCompleter). It is
// never retried.
var ErrResultUnsupported = errors.New("idemq: the store keeps no results")

// resultSlot is what a Message carries of its outcome: the result its
// handler returned (set by TxResult and LeaseResult), or the result stored
// with its key (set by the runner on a duplicate), and whether the runner
// settled the message as handled or as a duplicate.
type resultSlot struct {
	value    []byte
	returned bool         // the handler's adapter returned value
	state    outcomeState // set by the runner, before Ack
	err      error        // lease path: why the result was not stored
}

// outcomeState is how a message was settled, as Outcome reports it.
type outcomeState uint8

const (
	outcomeUnknown  outcomeState = iota // not settled, or not acknowledged
	outcomeFresh                        // the handler ran and its effect is durable
	outcomeReplayed                     // a duplicate: the stored result
)

// Outcome returns the outcome of m once the runner has settled it as
// handled or as a duplicate, which it does before it passes m to the
// Source's Ack: ok is false before, and for messages retried or
// dead-lettered. For a handled message, result is what its handler returned
// through TxResult, TxResultJSON, LeaseResult or LeaseResultJSON, and
// replayed is false. For a duplicate (a redelivery, a retried request, or a
// second copy of the key in one batch), result is the result stored with
// the key's record, byte for byte, and replayed is true. result is nil when
// the handler returned none (a plain TxHandler or Handler, a
// TransactionalBatch handler, which cannot return results, or a record
// written before results were stored). A Source that answers its producer
// (sources/httpsource, a request/reply consumer) reads it in Ack; nothing
// else should. The slice must not be modified.
func (m *Message) Outcome() (result []byte, replayed bool, ok bool) {
	switch m.res.state {
	case outcomeFresh:
		return m.res.value, false, true
	case outcomeReplayed:
		return m.res.value, true, true
	}
	return nil, false, false
}

// setReturned records the result a handler returned (or, with ok false,
// forgets a result of an earlier run of the handler).
func (m *Message) setReturned(b []byte, ok bool) {
	m.res.value, m.res.returned, m.res.err = b, ok, nil
}

// TxResult adapts a transactional handler that returns a result: the result
// is stored with the message's record, in the same transaction as the
// handler's writes (the store must implement dedup.ResultStorer, as pgdedup
// and sqldedup do), and a later duplicate of the key gets it back through
// Message.Outcome instead of running h. A failed handler stores nothing, so
// its retry runs h again. A result above Config.MaxResultBytes rolls the
// writes back and dead-letters the message with ErrResultTooLarge. A nil
// result is not stored (the record keeps none).
//
//	consumer.Transactional(store, consumer.TxResult(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) ([]byte, error) {
//		var id int64
//		err := tx.QueryRow(ctx, `INSERT INTO charges (amount) VALUES ($1) RETURNING id`, 500).Scan(&id)
//		return []byte(strconv.FormatInt(id, 10)), err
//	}))
func TxResult[Tx any](h func(ctx context.Context, tx Tx, msg *Message) ([]byte, error)) TxHandler[Tx] {
	return func(ctx context.Context, tx Tx, msg *Message) error {
		msg.setReturned(nil, false)
		b, err := h(ctx, tx, msg)
		if err != nil {
			return err
		}
		msg.setReturned(b, true)
		return nil
	}
}

// TxResultJSON is TxResult for typed handlers: it decodes the body as JSON
// into a T (a body that does not decode is dead-lettered with
// ErrMalformed, as with TxJSON), calls h, and stores its result encoded as
// JSON. A result that does not encode fails the message permanently.
func TxResultJSON[T, R, Tx any](h func(ctx context.Context, tx Tx, msg *Message, v T) (R, error)) TxHandler[Tx] {
	return TxResult(func(ctx context.Context, tx Tx, msg *Message) ([]byte, error) {
		v, err := decodeJSON[T](msg)
		if err != nil {
			return nil, err
		}
		res, err := h(ctx, tx, msg, v)
		if err != nil {
			return nil, err
		}
		return encodeResult(res)
	})
}

// LeaseResult adapts a handler of the lease path that returns a result: the
// result is stored next to the done key when the key is marked done (the
// store must implement dedup.ResultCompleter, as redisdedup does), and a
// later duplicate of the key gets it back through Message.Outcome. A failed
// handler stores nothing. The effect has happened by the time the result is
// checked, so a result above Config.MaxResultBytes (or the store's own
// limit, redisdedup.Config.MaxResultBytes) is dropped: the key is marked
// done without it, so the effect is not repeated, and the message is
// dead-lettered with ErrResultTooLarge.
func LeaseResult(h func(ctx context.Context, msg *Message) ([]byte, error)) Handler {
	return func(ctx context.Context, msg *Message) error {
		msg.setReturned(nil, false)
		b, err := h(ctx, msg)
		if err != nil {
			return err
		}
		msg.setReturned(b, true)
		return nil
	}
}

// LeaseResultJSON is LeaseResult for typed handlers: it decodes the body as
// JSON into a T (a body that does not decode is dead-lettered with
// ErrMalformed), calls h, and stores its result encoded as JSON.
func LeaseResultJSON[T, R any](h func(ctx context.Context, msg *Message, v T) (R, error)) Handler {
	return LeaseResult(func(ctx context.Context, msg *Message) ([]byte, error) {
		v, err := decodeJSON[T](msg)
		if err != nil {
			return nil, err
		}
		res, err := h(ctx, msg, v)
		if err != nil {
			return nil, err
		}
		return encodeResult(res)
	})
}

func encodeResult[R any](res R) ([]byte, error) {
	b, err := json.Marshal(res)
	if err != nil {
		return nil, Permanent(fmt.Errorf("idemq: encoding result %T: %w", res, err))
	}
	return b, nil
}

// result returns the result j's handler returned, if any and not nil.
func (j *job) result() ([]byte, bool) {
	r := &j.msg.res
	return r.value, r.returned && r.value != nil
}

// handled marks j as handled, for Message.Outcome: its handler's result,
// if any, is durable.
func (j *job) handled() {
	if !j.msg.res.returned {
		j.msg.res.value = nil
	}
	j.msg.res.state = outcomeFresh
}

// replay marks j as a duplicate whose record holds result.
func (j *job) replay(result []byte) {
	j.msg.res.value, j.msg.res.returned, j.msg.res.state = result, false, outcomeReplayed
}

// replayOf marks j, a later copy of leader's key in the same batch, as a
// duplicate with leader's result.
func (j *job) replayOf(leader *job) {
	v, _, _ := leader.msg.Outcome()
	j.replay(v)
}

// resultErr returns err, the error of j's handler, or when it is nil and
// the handler returned a result above Config.MaxResultBytes, a permanent
// error matching ErrResultTooLarge.
func (env *pathEnv) resultErr(j *job, err error) error {
	if err != nil {
		return err
	}
	return env.checkResult(j)
}

// checkResult reports a result of j above Config.MaxResultBytes.
func (env *pathEnv) checkResult(j *job) error {
	v, ok := j.result()
	if max := env.maxResultBytes; !ok || max < 0 || len(v) <= max {
		return nil
	}
	return Permanent(fmt.Errorf("%w: key %q: %d bytes, limit %d (Config.MaxResultBytes)",
		ErrResultTooLarge, j.key, len(v), env.maxResultBytes))
}

// storeResults writes the results of fresh's handlers into their records in
// tx, in one call to the store, before the commit. failed reports that the
// transaction must be rolled back, with res saying why: a store that keeps
// no results blames the first message with one; a statement refused because
// a handler aborted the transaction makes every handler a suspect; any
// other failure is the store's.
func (p *txPath[Tx]) storeResults(ctx context.Context, env *pathEnv, tx Tx, fresh []*job) (res tryResult, failed bool) {
	var (
		results []dedup.Result
		first   *job
	)
	for _, j := range fresh {
		if v, ok := j.result(); ok {
			results = append(results, dedup.Result{Key: j.key, Value: v})
			if first == nil {
				first = j
			}
		}
	}
	if len(results) == 0 {
		return tryResult{}, false
	}
	rs, ok := p.store.(dedup.ResultStorer[Tx])
	if !ok {
		return tryResult{err: Permanent(fmt.Errorf("%w: %T does not implement dedup.ResultStorer", ErrResultUnsupported, p.store)), culprit: first}, true
	}
	err := rs.StoreResults(ctx, tx, env.scope, results)
	switch {
	case err == nil:
		return tryResult{}, false
	case errors.Is(err, ErrResultUnsupported): // a wrapper of a store without results
		return tryResult{err: Permanent(err), culprit: first}, true
	case p.aborted(err):
		return tryResult{err: err, suspects: fresh}, true
	default:
		return tryResult{err: fmt.Errorf("idemq: store results: %w", err), infra: true}, true
	}
}

// completeKey marks j's key done under token on the lease path, with the
// result its handler returned when there is one and the store keeps
// results. A result the runner or the store refuses (too large, or a store
// without results) is left out, the key is marked done all the same (the
// effect happened and must not be repeated), and settleLease dead-letters
// the message.
func (p *leasePath) completeKey(ctx context.Context, env *pathEnv, j *job, token string) error {
	scope := env.scope
	if v, ok := j.result(); ok && j.msg.res.err == nil {
		rc, can := p.store.(dedup.ResultCompleter)
		switch err := env.checkResult(j); {
		case err != nil:
			j.msg.res.err = err
		case !can:
			j.msg.res.err = Permanent(fmt.Errorf("%w: %T does not implement dedup.ResultCompleter", ErrResultUnsupported, p.store))
		default:
			err := rc.CompleteWithResult(ctx, scope, j.key, token, p.opts.Retention, v)
			if !errors.Is(err, dedup.ErrResultTooLarge) && !errors.Is(err, ErrResultUnsupported) {
				return err
			}
			j.msg.res.err = Permanent(err)
		}
	}
	return p.store.Complete(ctx, scope, j.key, token, p.opts.Retention)
}

// settleLease gives j, whose handler succeeded and whose key is marked
// done, its outcome: acknowledged, or dead-lettered when its result could
// not be stored.
func (p *leasePath) settleLease(j *job) {
	if err := j.msg.res.err; err != nil {
		j.msg.setReturned(nil, false)
		j.set(outDeadLetter, err)
		return
	}
	j.set(outAck, nil)
	j.handled()
}
