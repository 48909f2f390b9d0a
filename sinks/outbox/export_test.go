package outbox

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/consumer"
)

// SetPartitionClock makes now the clock of r's partition maintenance
// (Config.Partitioned on PostgreSQL).
func SetPartitionClock(r *Relay, now func() time.Time) {
	r.st.(*pgStore).parts.Now = now
}

// PlantNaiveDrop gives r's partition maintenance the drop that
// partitioning by day invites and that the drop tests must catch: by age
// alone, without looking for rows the relay still needs.
func PlantNaiveDrop(r *Relay) {
	r.st.(*pgStore).parts.Kept = func(context.Context, pgx.Tx, string, time.Time) (bool, error) { return false, nil }
}

// PutReply writes the reply to msg under id, as Schema.Reply does.
func PutReply(ctx context.Context, db PgxQuerier, s Schema, id string, msg *consumer.Message, body []byte) error {
	return s.putReply(ctx, db, id, msg, body, false)
}
