package sqldedup

import (
	"database/sql"

	"github.com/idemq/idemq/dedup"
)

// What *Store implements, checked at compile time: its row of the capability
// table in the dedup package doc (a test in dedup/deduptest checks that they
// agree). The runner finds the optional interfaces by type assertion.
var (
	_ dedup.TxStore[*sql.Tx]      = (*Store)(nil)
	_ dedup.AbortClassifier       = (*Store)(nil)
	_ dedup.TransientClassifier   = (*Store)(nil)
	_ dedup.PoolSizer             = (*Store)(nil)
	_ dedup.RetentionReporter     = (*Store)(nil)
	_ dedup.TableStatsReporter    = (*Store)(nil)
	_ dedup.SchemaChecker         = (*Store)(nil)
	_ dedup.FailureCounter        = (*Store)(nil)
	_ dedup.ResultStorer[*sql.Tx] = (*Store)(nil)
)
