package pgdedup_test

import (
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
