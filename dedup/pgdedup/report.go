package pgdedup

import (
	"context"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/internal/sqlstore"
)

// Report reads the table's dedup.TableReport, sizes included, in two
// statements that scan the whole table. It returns the database's error
// (SQLSTATE 42P01) when the table does not exist.
func (s *Store) Report(ctx context.Context) (dedup.TableReport, error) {
	r := dedup.TableReport{At: time.Now().UTC(), Table: s.cfg.Schema + "." + s.cfg.Table}
	q, args := sqlstore.ReportQuery(true, s.q.table, r.At)
	rows, err := s.db.Query(ctx, q, args...)
	if err != nil {
		return r, fmt.Errorf("pgdedup: report: %w", err)
	}
	err = sqlstore.ScanReport(rows, &r)
	rows.Close()
	if err != nil {
		return r, fmt.Errorf("pgdedup: report: %w", err)
	}
	if err := s.db.QueryRow(ctx, sqlstore.PostgresSizeQuery, s.q.table).Scan(&r.TableBytes, &r.IndexBytes); err != nil {
		return r, fmt.Errorf("pgdedup: report: size: %w", err)
	}
	r.SizeKnown = true
	return r, nil
}
