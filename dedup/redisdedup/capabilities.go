package redisdedup

import "github.com/idemq/idemq/dedup"

// What *Store implements, checked at compile time: its row of the capability
// table in the dedup package doc (a test in dedup/deduptest checks that they
// agree). The runner finds the optional interfaces by type assertion.
var (
	_ dedup.LeaseStore         = (*Store)(nil)
	_ dedup.BatchClaimer       = (*Store)(nil)
	_ dedup.FailureCounter     = (*Store)(nil)
	_ dedup.ResultCompleter    = (*Store)(nil)
	_ dedup.DurabilityReporter = (*Store)(nil)
)
