// Package deduptest is the conformance suite that every idemq deduplication
// store runs against a real server: RunTxStore for the stores of the
// transactional path (dedupdriver.TxStore, such as dedup/pgdedup) and
// RunLeaseStore for the stores of the lease path (dedupdriver.LeaseStore,
// such as dedup/redisdedup); both run against the store's driver, and skip
// what its Caps does not report. CheckJanitorStats checks the table measurement of a
// store whose janitor reports one (dedup.TableStatsReporter).
//
// A store's test calls the suite with a constructor:
//
//	func TestConformance(t *testing.T) {
//		deduptest.RunLeaseStore(t, func(t *testing.T) dedupdriver.LeaseStore {
//			return newStore(t) // a store on the real server, closed with t.Cleanup
//		})
//	}
//
// The suite checks the properties the runner relies on: duplicate detection,
// a concurrent claim race with exactly one winner, expiry (of leases and of
// retained records), payload mismatch, release of a failed attempt, token
// guards on the lease path and the rollback and rerun of a batch on the transactional path.
// Every subtest runs in parallel with the others, on its own scope with
// unique keys, so several packages can share one server; each is bounded by
// a deadline, so a store that blocks fails instead of hanging.
//
// The suite waits for expiry by polling with a deadline and asserts on
// outcomes, never on durations, so a slow machine makes it slower, not flaky.
package deduptest
