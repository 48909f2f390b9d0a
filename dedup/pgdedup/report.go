package pgdedup

import (
	"context"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/internal/sqlstore"
)

// Report reads the table: per scope its records, oldest and newest, the
// expired records the janitor has not deleted yet and the records by age;
// and the sizes of the table and its indexes. It reads every row, so it
// costs a scan of the table: it is for operators (`idemq stats`), not for
// a metrics loop (see TableStats). It returns the database's error when the
// table does not exist.
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
