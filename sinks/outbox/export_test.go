package outbox

import "time"

// SetPartitionClock makes now the clock of r's partition maintenance
// (Config.Partitioned on PostgreSQL).
func SetPartitionClock(r *Relay, now func() time.Time) {
	r.st.(*pgStore).parts.Now = now
}
