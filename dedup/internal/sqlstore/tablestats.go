package sqlstore

import (
	"sync/atomic"
	"time"

	"github.com/idemq/idemq/dedup"
)

// TableStats holds the janitor's latest measurement of a store's table. The
// zero value holds none.
type TableStats struct {
	latest atomic.Pointer[dedup.TableStats]
}

// Get returns the latest measurement, and false before the first.
func (t *TableStats) Get() (dedup.TableStats, bool) {
	if st := t.latest.Load(); st != nil {
		return *st, true
	}
	return dedup.TableStats{}, false
}

// Rows is what Collect reads: *sql.Rows and pgx.Rows both are.
type Rows interface {
	Next() bool
	Err() error
}

// Collect reads one dedup.ScopeStats per row with scan and, when every row
// was read, makes them, taken at now, the latest measurement.
func (t *TableStats) Collect(rows Rows, scan func(*dedup.ScopeStats) error) error {
	st := dedup.TableStats{Scopes: []dedup.ScopeStats{}}
	for rows.Next() {
		var sc dedup.ScopeStats
		if err := scan(&sc); err != nil {
			return err
		}
		st.Scopes = append(st.Scopes, sc)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	st.At = time.Now()
	t.latest.Store(&st)
	return nil
}
