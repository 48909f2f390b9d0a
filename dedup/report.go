package dedup

import (
	"time"
)

// TableReport is a SQL store's account of its processed-message table, read
// from the table when asked (the store's Report method), for operators and
// `idemq stats`. Unlike TableStats, which the janitor measures in the
// background, it also counts expired records, ages and sizes. Reading it
// scans the whole table: it is not for a metrics loop.
type TableReport struct {
	// At is the time the report was read, the "now" of its ages and
	// expiries.
	At time.Time
	// Table is the table's name as messages give it: schema-qualified
	// when it has a schema.
	Table string
	// Scopes holds one entry per scope with records, in scope order.
	Scopes []ScopeReport
	// SizeKnown tells whether TableBytes and IndexBytes were measured:
	// always on PostgreSQL, on SQLite when its driver has the dbstat
	// table.
	SizeKnown bool
	// TableBytes is the table's size on disk, IndexBytes its indexes'.
	TableBytes, IndexBytes int64
}

// ScopeReport describes the records of one scope.
type ScopeReport struct {
	// ScopeStats holds the scope, its number of records and the time its
	// oldest record was processed.
	ScopeStats
	// Newest is when the newest record of the scope was processed.
	Newest time.Time
	// Expired counts the records past their expiry that the janitor has
	// not deleted yet: they no longer deduplicate.
	Expired int64
	// Ages counts the records by age (TableReport.At minus the time they
	// were processed), youngest first; each record is in one bucket.
	Ages []AgeCount
}

// AgeCount is one bucket of ScopeReport.Ages: the records younger than
// Under and no younger than the previous bucket's Under. The last bucket
// has Under 0 and holds the records older than every other bound. The
// bounds are 1 minute, 1 hour, 1 day and 7 days.
type AgeCount struct {
	Under   time.Duration
	Records int64
}

// TableStats is a measurement of a store's processed-message table, made by
// its janitor.
type TableStats struct {
	// At is when the table was measured.
	At time.Time
	// Scopes holds one entry per scope with records, in scope order.
	Scopes []ScopeStats
}

// ScopeStats describes the records of one scope.
type ScopeStats struct {
	Scope string
	// Records is the number of records of the scope, after the janitor's
	// cleanup that preceded the measurement.
	Records int64
	// Oldest is when the oldest record of the scope was processed.
	Oldest time.Time
}

// Records returns the number of records of every scope.
func (s TableStats) Records() int64 {
	var n int64
	for _, sc := range s.Scopes {
		n += sc.Records
	}
	return n
}

// TableStatsReporter is implemented by stores whose janitor measures their
// table (pgdedup, sqldedup). TableStats returns the latest measurement
// without touching the database, and false before the first one. It is safe
// for concurrent use. otelidemq exports it as gauges (Hook.ObserveDedup).
type TableStatsReporter interface {
	TableStats() (TableStats, bool)
}
