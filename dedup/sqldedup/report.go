package sqldedup

import (
	"context"
	"fmt"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/internal/sqlstore"
)

// Report reads the table's dedup.TableReport in statements that scan the
// whole table; on SQLite the sizes are known only where the driver has the
// dbstat table. It returns the database's error when the table does not
// exist.
func (s *Store) Report(ctx context.Context) (dedup.TableReport, error) {
	pg := s.cfg.Dialect == Postgres
	r := dedup.TableReport{At: time.Now().UTC(), Table: s.cfg.Table}
	if pg {
		r.Table = s.cfg.Schema + "." + s.cfg.Table
	}
	q, args := sqlstore.ReportQuery(pg, s.q.table, r.At)
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return r, fmt.Errorf("sqldedup: report: %w", err)
	}
	err = sqlstore.ScanReport(rows, &r)
	if cerr := rows.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return r, fmt.Errorf("sqldedup: report: %w", err)
	}
	if !pg {
		// Without dbstat in the driver the sizes stay unknown.
		r.SizeKnown = s.db.QueryRowContext(ctx, sqlstore.SQLiteSizeQuery, s.cfg.Table).Scan(&r.TableBytes, &r.IndexBytes) == nil
		return r, nil
	}
	if err := s.db.QueryRowContext(ctx, sqlstore.PostgresSizeQuery, s.q.table).Scan(&r.TableBytes, &r.IndexBytes); err != nil {
		return r, fmt.Errorf("sqldedup: report: size: %w", err)
	}
	r.SizeKnown = true
	return r, nil
}
