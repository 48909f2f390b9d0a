package memdedup

import "github.com/idemq/idemq/dedup"

// What *Store and *Leases implement, checked at compile time: their rows of
// the capability table in the dedup package doc (a test in dedup/deduptest
// checks that they agree). The runner finds the optional interfaces by type
// assertion.
var (
	_ dedup.TxStore[*Tx]      = (*Store)(nil)
	_ dedup.RetentionReporter = (*Store)(nil)
	_ dedup.FailureCounter    = (*Store)(nil)
	_ dedup.ResultStorer[*Tx] = (*Store)(nil)

	_ dedup.LeaseStore      = (*Leases)(nil)
	_ dedup.FailureCounter  = (*Leases)(nil)
	_ dedup.ResultCompleter = (*Leases)(nil)
)
