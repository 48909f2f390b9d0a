package dedup

import "time"

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
