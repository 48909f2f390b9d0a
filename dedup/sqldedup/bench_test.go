package sqldedup_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/sqldedup"
)

// BenchmarkClaimCommit measures one runner transaction: Begin, Claim of a
// batch of new keys, Commit. keys/s is the throughput of the dedup record
// alone (the handler's own writes come on top).
//
//	go test -run='^$' -bench=ClaimCommit ./dedup/sqldedup
func BenchmarkClaimCommit(b *testing.B) {
	for _, backend := range []string{"sqlite", "postgres"} {
		for _, batch := range []int{1, 100} {
			b.Run(fmt.Sprintf("%s/batch=%d", backend, batch), func(b *testing.B) {
				store := benchStore(b, backend)
				ctx := context.Background()
				hash := dedup.HashPayload([]byte("payload"))
				recs := make([]dedup.Record, batch)
				n := 0
				b.ResetTimer()
				for b.Loop() {
					for i := range recs {
						recs[i] = dedup.Record{Key: fmt.Sprintf("k%09d", n), PayloadHash: hash}
						n++
					}
					tx, err := store.Driver().Begin(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := store.Driver().Claim(ctx, tx, "bench", recs); err != nil {
						b.Fatal(err)
					}
					if err := store.Driver().Commit(ctx, tx); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "keys/s")
			})
		}
	}
}

func benchStore(b *testing.B, backend string) *sqldedup.Store {
	b.Helper()
	switch backend {
	case "sqlite":
		return migrated(b, sqliteFile(b), sqldedup.Config{Dialect: sqldedup.SQLite})
	default:
		db, schema := postgres(b)
		return migrated(b, db, sqldedup.Config{Dialect: sqldedup.Postgres, Schema: schema})
	}
}
