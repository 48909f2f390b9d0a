package pgdedup_test

import (
	"time"

	"github.com/jackc/pgx/v5"
	"strconv"
	"testing"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgdedup"
)

// BenchmarkCommitChain measures the transactional path's claim at batch 1
// on a busy lane: COMMIT AND CHAIN pipelined with the next key's claim, one
// round trip per key. Its allocations per op are the store's share of a
// message's.
//
//	go test -run '^$' -bench CommitChain -benchmem ./dedup/pgdedup
func BenchmarkCommitChain(b *testing.B) {
	s, _ := newStore(b, pgdedup.Config{})
	ctx := b.Context()
	h := dedup.HashPayload([]byte("{}"))
	rec := func(i int) []dedup.Record { return []dedup.Record{{Key: "k" + strconv.Itoa(i), PayloadHash: h}} }
	tx, _, err := s.Driver().BeginClaim(ctx, "bench", rec(0))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = s.Driver().Rollback(ctx, tx) }()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		cs, chained, err := s.Driver().CommitChain(ctx, tx, "bench", rec(i))
		if err != nil || !chained || cs[0].State != dedup.StateNew {
			b.Fatalf("CommitChain: %v, chained %v, claims %+v", err, chained, cs)
		}
	}
}

// BenchmarkClaimLayout compares the claim on an unpartitioned table and on
// one partitioned by day (Config.Partitioned), each holding prefill records
// spread over the 8 days of the default retention: new keys at batch 1
// (CommitChain, as a busy lane), new keys at batch 100, and duplicates at
// batch 1 (the lookup of a record in an older partition). The partitioned
// table has a partition per day of the retention and two ahead (12).
//
//	go test -run '^$' -bench ClaimLayout -benchtime 3000x -count 3 ./dedup/pgdedup
func BenchmarkClaimLayout(b *testing.B) {
	const prefill = 200_000
	for _, partitioned := range []bool{false, true} {
		name := "unpartitioned"
		if partitioned {
			name = "partitioned"
		}
		b.Run(name, func(b *testing.B) {
			s, pool := newStore(b, pgdedup.Config{Partitioned: partitioned})
			ctx := b.Context()
			if partitioned {
				// Daily partitions over the retention, not the migration's
				// first one, which covers every time before the day after
				// tomorrow.
				var first string
				if err := pool.QueryRow(ctx, `SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = $1::regclass`,
					pgx.Identifier{s.Config().Schema, s.Config().Table}.Sanitize()).Scan(&first); err != nil {
					b.Fatal(err)
				}
				if _, err := pool.Exec(ctx, `DROP TABLE `+first); err != nil {
					b.Fatal(err)
				}
				clock := &testClock{}
				cfg := s.Config()
				cfg.Now = clock.Now
				past, err := pgdedup.New(pool, cfg)
				if err != nil {
					b.Fatal(err)
				}
				for d := 8; d >= 0; d-- {
					clock.Set(time.Now().AddDate(0, 0, -d))
					if _, err := past.Cleanup(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
			if _, err := pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{s.Config().Schema, s.Config().Table}.Sanitize()+`
(scope, key, payload_hash, processed_at, expires_at)
SELECT 'bench', 'old' || i, decode(repeat('00', 32), 'hex'), t, t + interval '8 days'
FROM generate_series(1, $1) AS i, LATERAL (SELECT now() - (i % 192) * interval '1 hour' AS t) AS p`, prefill); err != nil {
				b.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `ANALYZE `+pgx.Identifier{s.Config().Schema, s.Config().Table}.Sanitize()); err != nil {
				b.Fatal(err)
			}
			h := dedup.HashPayload([]byte("{}"))
			var (
				n   int
				old = dedup.Hash{}
			)
			batch := func(size int, prefix string, hash dedup.Hash) []dedup.Record {
				recs := make([]dedup.Record, size)
				for i := range recs {
					n++
					recs[i] = dedup.Record{Key: prefix + strconv.Itoa(n), PayloadHash: hash}
				}
				return recs
			}
			for _, bc := range []struct {
				name string
				recs func() []dedup.Record
				want dedup.State
			}{
				{"new/batch1", func() []dedup.Record { return batch(1, "k", h) }, dedup.StateNew},
				{"new/batch100", func() []dedup.Record { return batch(100, "k", h) }, dedup.StateNew},
				{"duplicate/batch1", func() []dedup.Record {
					n = n % prefill
					return batch(1, "old", old)
				}, dedup.StateDone},
			} {
				b.Run(bc.name, func(b *testing.B) {
					tx, _, err := s.Driver().BeginClaim(ctx, "bench", bc.recs())
					if err != nil {
						b.Fatal(err)
					}
					defer func() { _ = s.Driver().Rollback(ctx, tx) }()
					b.ResetTimer()
					for range b.N {
						recs := bc.recs()
						cs, chained, err := s.Driver().CommitChain(ctx, tx, "bench", recs)
						if err != nil || !chained || cs[0].State != bc.want {
							b.Fatalf("CommitChain: %v, chained %v, claims %+v", err, chained, cs[0])
						}
					}
					b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*len(bc.recs())), "µs/key")
				})
			}
		})
	}
}
