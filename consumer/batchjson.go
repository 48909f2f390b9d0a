package consumer

import "context"

// BatchItem is one decoded message of a TxBatchJSON handler;
// Msg.KeyContext(ctx) gives the context with its keys.
type BatchItem[T any] struct {
	Msg   *Message
	Value T
}

// TxBatchJSON adapts a typed batch handler: it decodes every message's body
// as JSON into a T and calls h with the items in delivery order. A body that
// does not decode is dead-lettered with ErrMalformed, without retries, and
// the others run without it.
//
//	consumer.TransactionalBatch(store, consumer.TxBatchJSON(func(ctx context.Context, tx pgx.Tx, items []consumer.BatchItem[Order]) error {
//		ids, amounts := make([]int64, len(items)), make([]int64, len(items))
//		for i, it := range items {
//			ids[i], amounts[i] = it.Value.Account, it.Value.Amount
//		}
//		_, err := tx.Exec(ctx, `UPDATE accounts a SET balance = a.balance + u.amount
//			FROM (SELECT id, sum(amount) AS amount FROM unnest($1::bigint[], $2::bigint[]) AS u(id, amount) GROUP BY id) u
//			WHERE a.id = u.id`, ids, amounts)
//		return err
//	}))
func TxBatchJSON[T, Tx any](h func(ctx context.Context, tx Tx, items []BatchItem[T]) error) TxBatchHandler[Tx] {
	return func(ctx context.Context, tx Tx, msgs []*Message) error {
		items := make([]BatchItem[T], len(msgs))
		for i, m := range msgs {
			v, err := decodeJSON[T](m)
			if err != nil {
				return &MessageError{Msg: m, Err: err}
			}
			items[i] = BatchItem[T]{Msg: m, Value: v}
		}
		return h(ctx, tx, items)
	}
}
