package sqlstore

import (
	"context"
	"time"

	"github.com/idemq/idemq/dedup"
)

// Measure counts the table's records per scope and finds each scope's
// oldest, and makes them, when every row was read, the measurement that
// TableStats returns.
func (s *Store) Measure(ctx context.Context) error {
	rows, err := s.db.Query(ctx, "SELECT scope, count(*), min("+s.Micros("processed_at")+") FROM "+s.quoted+" GROUP BY scope ORDER BY scope")
	if err != nil {
		return s.wrap("measure the table", err)
	}
	st := dedup.TableStats{Scopes: []dedup.ScopeStats{}}
	for rows.Next() {
		var sc dedup.ScopeStats
		var oldest int64
		if err = rows.Scan(&sc.Scope, &sc.Records, &oldest); err != nil {
			break
		}
		sc.Oldest = time.UnixMicro(oldest)
		st.Scopes = append(st.Scopes, sc)
	}
	if err := closeRows(rows, err); err != nil {
		return s.wrap("measure the table", err)
	}
	st.At = time.Now()
	s.stats.Store(&st)
	return nil
}

// TableStats returns the latest measurement of Measure, and false before
// the first one.
func (s *Store) TableStats() (dedup.TableStats, bool) {
	if st := s.stats.Load(); st != nil {
		return *st, true
	}
	return dedup.TableStats{}, false
}
