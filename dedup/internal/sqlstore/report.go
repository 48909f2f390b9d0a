package sqlstore

import (
	"fmt"
	"strings"
	"time"

	"github.com/idemq/idemq/dedup"
)

// ageBounds are the upper bounds of dedup.ScopeReport.Ages but the last.
var ageBounds = []time.Duration{time.Minute, time.Hour, 24 * time.Hour, 7 * 24 * time.Hour}

// ReportQuery returns the statement that reads a dedup.ScopeReport per
// scope of table t (quoted, and qualified where the database has schemas)
// at now, and its arguments: one row per scope, in scope order, that
// ScanReport reads. Times cross the driver as Unix microseconds in both
// dialects.
func ReportQuery(postgres bool, t string, now time.Time) (string, []any) {
	ph := func(n int) string {
		if postgres {
			return fmt.Sprintf("$%d", n)
		}
		return fmt.Sprintf("?%d", n)
	}
	var b strings.Builder
	args := []any{now.UnixMicro()}
	processed := "processed_at"
	expires := "expires_at"
	if postgres {
		processed = "(extract(epoch FROM processed_at) * 1000000)::bigint"
		expires = "(extract(epoch FROM expires_at) * 1000000)::bigint"
	}
	fmt.Fprintf(&b, "SELECT scope, count(*), min(%[1]s), max(%[1]s), count(*) FILTER (WHERE %[2]s <= %[3]s)", processed, expires, ph(1))
	for _, d := range ageBounds {
		args = append(args, now.Add(-d).UnixMicro())
		fmt.Fprintf(&b, ", count(*) FILTER (WHERE %s > %s)", processed, ph(len(args)))
	}
	b.WriteString(" FROM " + t + " GROUP BY scope ORDER BY scope")
	return b.String(), args
}

// ScanRows is what ScanReport reads: *sql.Rows and pgx.Rows both are.
type ScanRows interface {
	Rows
	Scan(dest ...any) error
}

// ScanReport reads the rows of ReportQuery into the scopes of r.
func ScanReport(rows ScanRows, r *dedup.TableReport) error {
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

// PostgresSizeQuery returns the sizes of table t (quoted and qualified), and
// of its indexes, in bytes (of its partitions, when it is partitioned); its
// one argument is t.
const PostgresSizeQuery = `SELECT sum(pg_table_size(r))::bigint, sum(pg_indexes_size(r))::bigint
FROM (SELECT to_regclass($1) UNION SELECT relid FROM pg_partition_tree(to_regclass($1))) AS t(r)`

// SQLiteSizeQuery returns the sizes of table ?1 (unquoted), and of its
// indexes, in bytes, from the dbstat table: an error where the driver was
// built without it.
const SQLiteSizeQuery = `SELECT (SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name = ?1),
	(SELECT coalesce(sum(d.pgsize), 0) FROM dbstat d JOIN sqlite_master m ON m.name = d.name WHERE m.type = 'index' AND m.tbl_name = ?1)`
