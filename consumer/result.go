package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
)

// ErrResultTooLarge is matched by the dead-letter reason of a message whose
// handler returned a result larger than Config.MaxResultBytes (or than the
// lease store's own limit). It is dedup.ErrResultTooLarge. It is never
// retried: the same handler would return the same result again.
var ErrResultTooLarge = dedup.ErrResultTooLarge

// ErrResultUnsupported is matched by the dead-letter reason of a message
// whose handler returned a result that the path's store cannot keep (its
// driver has no dedupdriver.Caps.Results). It is never retried.
var ErrResultUnsupported = errors.New("idemq: the store keeps no results")

// TxResult adapts a transactional handler that returns a result: the result
// is stored with the message's record, in the same transaction as the
// handler's writes (the store must keep results, dedupdriver.Caps.Results, as
// pgdedup and sqldedup do), and a later duplicate of the key gets it back through
// StoredResult instead of running h. A failed handler stores nothing, so
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
		return msg.keepResult(h(ctx, tx, msg))
	}
}

// TxResultJSON is TxResult for typed handlers: it decodes the body as JSON
// into a T (a body that does not decode is dead-lettered with
// ErrMalformed, as with TxJSON), calls h, and stores its result encoded as
// JSON. A result that does not encode fails the message permanently.
func TxResultJSON[T, R, Tx any](h func(ctx context.Context, tx Tx, msg *Message, v T) (R, error)) TxHandler[Tx] {
	return TxResult(func(ctx context.Context, tx Tx, msg *Message) ([]byte, error) {
		return jsonResult(msg, func(v T) (R, error) { return h(ctx, tx, msg, v) })
	})
}

// Result adapts a handler of the lease path that returns a result: the
// result is stored next to the done key when the key is marked done (the
// store must keep results, dedupdriver.Caps.Results, as redisdedup does), and a
// later duplicate of the key gets it back through StoredResult. A failed
// handler stores nothing. The effect has happened by the time the result is
// checked, so a result above Config.MaxResultBytes (or the store's own
// limit, redisdedup.Config.MaxResultBytes) is dropped: the key is marked
// done without it, so the effect is not repeated, and the message is
// dead-lettered with ErrResultTooLarge.
func Result(h func(ctx context.Context, msg *Message) ([]byte, error)) Handler {
	return func(ctx context.Context, msg *Message) error {
		msg.setReturned(nil, false)
		return msg.keepResult(h(ctx, msg))
	}
}

// ResultJSON is Result for typed handlers: it decodes the body as
// JSON into a T (a body that does not decode is dead-lettered with
// ErrMalformed), calls h, and stores its result encoded as JSON.
func ResultJSON[T, R any](h func(ctx context.Context, msg *Message, v T) (R, error)) Handler {
	return Result(func(ctx context.Context, msg *Message) ([]byte, error) {
		return jsonResult(msg, func(v T) (R, error) { return h(ctx, msg, v) })
	})
}

// result returns the result j's handler returned, if any and not nil.
func (j *job) result() ([]byte, bool) {
	r := &j.msg.res
	return r.value, r.returned && r.value != nil
}

// handled marks j as handled, for StoredResult: its handler's result,
// if any, is durable.
func (j *job) handled() {
	if !j.msg.res.returned {
		j.msg.res.value = nil
	}
	j.msg.res.state = resultFresh
}

// replay marks j as a duplicate whose record holds result.
func (j *job) replay(result []byte) {
	j.msg.res.value, j.msg.res.returned, j.msg.res.state = result, false, resultReplayed
}

func (m *Message) keepResult(b []byte, err error) error {
	if err == nil {
		m.setReturned(b, true)
	}
	return err
}

// jsonResult decodes m's body as JSON into a T, calls h with it and
// encodes its result as JSON; a result that does not encode is a
// permanent failure.
func jsonResult[T, R any](m *Message, h func(v T) (R, error)) ([]byte, error) {
	v, err := decodeJSON[T](m)
	if err != nil {
		return nil, err
	}
	res, err := h(v)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(res)
	if err != nil {
		return nil, Permanent(fmt.Errorf("idemq: encoding result %T: %w", res, err))
	}
	return b, nil
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
	if !p.caps.Results {
		return tryResult{err: Permanent(fmt.Errorf("%w: %T keeps no results", ErrResultUnsupported, p.store)), culprit: first}, true
	}
	err := p.drv.StoreResults(ctx, tx, env.scope, results)
	switch {
	case err == nil:
		return tryResult{}, false
	case errors.Is(err, ErrResultUnsupported), errors.Is(err, dedupdriver.ErrUnsupported): // a wrapper of a store without results
		return tryResult{err: Permanent(err), culprit: first}, true
	case p.aborted(err):
		return tryResult{err: err, suspects: fresh}, true
	default:
		return tryResult{err: fmt.Errorf("idemq: store results: %w", err), infra: true}, true
	}
}

// checkResult returns the result j's handler returned, nil if none, and a
// permanent error matching ErrResultTooLarge when it is above
// Config.MaxResultBytes.
func (env *pathEnv) checkResult(j *job) ([]byte, error) {
	v, ok := j.result()
	if !ok {
		return nil, nil
	}
	if max := env.maxResultBytes; max < 0 || len(v) <= max {
		return v, nil
	}
	return v, Permanent(fmt.Errorf("%w: key %q: %d bytes, limit %d (Config.MaxResultBytes)",
		ErrResultTooLarge, j.key, len(v), env.maxResultBytes))
}
