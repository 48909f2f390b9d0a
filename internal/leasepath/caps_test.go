package leasepath_test

import (
	"testing"

	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/dedup/redisdedup"
	"github.com/redis/go-redis/v9"
)

// redisdedup's driver offers the runner what the Runner took from the
// store when it asserted optional interfaces on it (BatchClaimer,
// FailureCounter, ResultCompleter, DurabilityReporter) and nothing of the
// transactional path. consumer's TestRunnerSeesEachStoresCapabilities
// checks the other stores, and that a forwarding wrapper keeps what a
// driver's Caps say; this one sits here because consumer's tests may not
// import go-redis.
func TestRedisDriverCaps(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	rs, err := redisdedup.New(rdb, redisdedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	want := dedupdriver.Caps{BatchClaim: true, FailureCount: true, Results: true, Durability: true}
	if got := rs.Driver().Caps(); got != want {
		t.Fatalf("redisdedup's driver Caps = %+v, want %+v", got, want)
	}
}
