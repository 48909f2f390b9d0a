package redisdedup_test

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/redisdedup"
)

// BenchmarkClaim measures the Lua claim of a fresh key from 4×GOMAXPROCS
// goroutines: the ceiling the lease path is compared with.
//
//	go test -run '^$' -bench . ./dedup/redisdedup
//
// cmd/internal/bench/lease runs the same claim next to the runner's lease path.
func BenchmarkClaim(b *testing.B) { benchStore(b, false) }

// BenchmarkClaimComplete measures a claim and the completion of the same key:
// all the Redis work the lease path does per message.
func BenchmarkClaimComplete(b *testing.B) { benchStore(b, true) }

func benchStore(b *testing.B, complete bool) {
	s, _ := newStore(b, redisdedup.Config{})
	scope, h := unique("bench"), dedup.HashPayload([]byte("{}"))
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := b.Context()
		tok := token()
		for pb.Next() {
			key := "k" + strconv.FormatInt(n.Add(1), 10)
			if _, err := s.Claim(ctx, scope, dedup.Record{Key: key, PayloadHash: h}, tok, time.Minute); err != nil {
				b.Error(err)
				return
			}
			if complete {
				if err := s.Complete(ctx, scope, key, tok, time.Minute); err != nil {
					b.Error(err)
					return
				}
			}
		}
	})
}
