package sqlstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/idemq/idemq/dedup"
)

// ageBounds are the upper bounds of dedup.ScopeReport.Ages but the last.
var ageBounds = []time.Duration{time.Minute, time.Hour, 24 * time.Hour, 7 * 24 * time.Hour}

// Report reads the table's dedup.TableReport in statements that scan the
// whole table. On SQLite the sizes are known only where the driver has the
// dbstat table.
func (s *Store) Report(ctx context.Context) (dedup.TableReport, error) {
	r := dedup.TableReport{At: time.Now().UTC(), Table: s.display}
	q, args := s.reportQuery(r.At)
	rows, err := s.db.Query(ctx, q, args...)
	if err != nil {
		return r, s.wrap("report", err)
	}
	if err := closeRows(rows, scanReport(rows, &r)); err != nil {
		return r, s.wrap("report", err)
	}
	if !s.postgres {
		// Without dbstat in the driver the sizes stay unknown.
		r.SizeKnown = s.db.QueryRow(ctx, sqliteSizeQuery, s.plain).Scan(&r.TableBytes, &r.IndexBytes) == nil
		return r, nil
	}
	if err := s.db.QueryRow(ctx, postgresSizeQuery, s.quoted).Scan(&r.TableBytes, &r.IndexBytes); err != nil {
		return r, s.wrap("report: size", err)
	}
	r.SizeKnown = true
	return r, nil
}

// reportQuery returns the statement that reads a dedup.ScopeReport per
// scope of the table at now, and its arguments: one row per scope, in
// scope order, that scanReport reads.
func (s *Store) reportQuery(now time.Time) (string, []any) {
	var b strings.Builder
	args := []any{now.UnixMicro()}
	processed := s.Micros("processed_at")
	fmt.Fprintf(&b, "SELECT scope, count(*), min(%[1]s), max(%[1]s), count(*) FILTER (WHERE %[2]s <= %[3]s)", processed, s.Micros("expires_at"), s.Ph(1))
	for _, d := range ageBounds {
		args = append(args, now.Add(-d).UnixMicro())
		fmt.Fprintf(&b, ", count(*) FILTER (WHERE %s > %s)", processed, s.Ph(len(args)))
	}
	b.WriteString(" FROM " + s.quoted + " GROUP BY scope ORDER BY scope")
	return b.String(), args
}

// scanReport reads the rows of reportQuery into the scopes of r.
func scanReport(rows ScanRows, r *dedup.TableReport) error {
	r.Scopes = []dedup.ScopeReport{}
	for rows.Next() {
		var s dedup.ScopeReport
		var oldest, newest int64
		younger := make([]int64, len(ageBounds))
		dest := []any{&s.Scope, &s.Records, &oldest, &newest, &s.Expired}
		for i := range younger {
			dest = append(dest, &younger[i])
		}
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		s.Oldest, s.Newest = time.UnixMicro(oldest).UTC(), time.UnixMicro(newest).UTC()
		// younger[i] counts the records newer than bound i: cumulative.
		prev := int64(0)
		for i, d := range ageBounds {
			s.Ages = append(s.Ages, dedup.AgeCount{Under: d, Records: younger[i] - prev})
			prev = younger[i]
		}
		s.Ages = append(s.Ages, dedup.AgeCount{Records: s.Records - prev})
		r.Scopes = append(r.Scopes, s)
	}
	return rows.Err()
}

// postgresSizeQuery returns the sizes of table t (quoted and qualified), and
// of its indexes, in bytes (of its partitions, when it is partitioned); its
// one argument is t.
const postgresSizeQuery = `SELECT sum(pg_table_size(r))::bigint, sum(pg_indexes_size(r))::bigint
FROM (SELECT to_regclass($1) UNION SELECT relid FROM pg_partition_tree(to_regclass($1))) AS t(r)`

// sqliteSizeQuery returns the sizes of table ?1 (unquoted), and of its
// indexes, in bytes, from the dbstat table: an error where the driver was
// built without it.
const sqliteSizeQuery = `SELECT (SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name = ?1),
	(SELECT coalesce(sum(d.pgsize), 0) FROM dbstat d JOIN sqlite_master m ON m.name = d.name WHERE m.type = 'index' AND m.tbl_name = ?1)`

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
