package sqlstore

import (
	"regexp"
	"time"

	"github.com/idemq/idemq/internal/cfgerr"
)

// Limits on the fields pgdedup.Config and sqldedup.Config share.
const (
	// MaxSchemaBytes is PostgreSQL's identifier limit (NAMEDATALEN-1).
	MaxSchemaBytes = 63
	// MaxTableBytes leaves room within MaxSchemaBytes for the names derived
	// from the table (FailuresSuffix, index names).
	MaxTableBytes = 50
	// MinRetention is the shortest Retention either store accepts. Records
	// keep microsecond expiry times, so shorter would work mechanically,
	// but a retention below a second cannot cover a redelivery; one second
	// is also the floor of consumer.LeaseOptions.Retention and what the
	// dedup/deduptest suites exercise.
	MinRetention = time.Second
)

// IdentRE is the rule for the schema and table names: plain SQL
// identifiers, which the stores splice into statements quoted, and which
// Render relies on.
var IdentRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Settings are the Config fields pgdedup and sqldedup share, after their
// defaults.
type Settings struct {
	// Postgres says the database is PostgreSQL, which has schemas: Schema
	// is checked, and qualifies the tables, only then.
	Postgres         bool
	Schema           string
	Table            string
	Retention        time.Duration
	CleanupInterval  time.Duration
	CleanupBatchSize int
}

// Validate adds to l a configuration error for each invalid field of s.
func (s Settings) Validate(l *cfgerr.List) {
	if s.Postgres {
		ValidIdent(l, "Schema", s.Schema, MaxSchemaBytes)
	}
	ValidIdent(l, "Table", s.Table, MaxTableBytes)
	if s.Retention < MinRetention {
		l.Addf("Retention", "%s is below %s", s.Retention, MinRetention)
	}
	if s.CleanupInterval < 0 {
		l.Addf("CleanupInterval", "%s is negative", s.CleanupInterval)
	}
	if s.CleanupBatchSize < 1 {
		l.Addf("CleanupBatchSize", "%d is not positive", s.CleanupBatchSize)
	}
}

// ValidIdent adds to l a configuration error for field unless its value s
// is a plain SQL identifier (IdentRE) of at most max bytes.
func ValidIdent(l *cfgerr.List, field, s string, max int) {
	if !IdentRE.MatchString(s) || len(s) > max {
		l.Addf(field, "%q is not a plain SQL identifier of at most %d bytes", s, max)
	}
}
