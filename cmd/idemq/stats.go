package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/sinks/outbox"
)

// ageBuckets are the upper bounds of the age distribution of `idemq stats`.
var ageBuckets = []struct {
	name string
	max  time.Duration
}{
	{"<1m", time.Minute},
	{"<1h", time.Hour},
	{"<1d", 24 * time.Hour},
	{"<7d", 7 * 24 * time.Hour},
}

// scopeStats describes the records of one scope.
type scopeStats struct {
	Scope   string    `json:"scope"`
	Records int64     `json:"records"`
	Oldest  time.Time `json:"oldest"`
	Newest  time.Time `json:"newest"`
	// Expired counts records past their expiry that the janitor has not
	// deleted yet: they no longer deduplicate.
	Expired int64 `json:"expired_not_deleted"`
	// Ages counts records by age (now minus processed_at): <1m, <1h, <1d,
	// <7d, >=7d; each record is in one bucket.
	Ages map[string]int64 `json:"ages"`
}

// tableStats is the output of `idemq stats`.
type tableStats struct {
	// Schema is the table's PostgreSQL schema; absent on SQLite.
	Schema string       `json:"schema,omitempty"`
	Table  string       `json:"table"`
	At     time.Time    `json:"at"`
	Scopes []scopeStats `json:"scopes"`
	Total  int64        `json:"records"`
	// TableBytes and IndexBytes are the table's and its indexes' sizes on
	// disk (SQLite: the pages dbstat counts); nil (null) when unknown.
	TableBytes *int64 `json:"table_bytes"`
	IndexBytes *int64 `json:"index_bytes"`
	// Outbox describes the transactional outbox's table in the same schema
	// (or SQLite file); nil when there is none.
	Outbox *outboxStats `json:"outbox,omitempty"`
}

// outboxStats counts the rows of the outbox table (sinks/outbox) by state.
type outboxStats struct {
	// Table is the outbox table's name, in tableStats.Schema.
	Table   string `json:"table"`
	Pending int64  `json:"pending"`
	Sent    int64  `json:"sent"`
	Parked  int64  `json:"parked"`
	// OldestPending and OldestParked are the creation times of the oldest
	// pending and parked rows; absent without one.
	OldestPending *time.Time `json:"oldest_pending,omitempty"`
	OldestParked  *time.Time `json:"oldest_parked,omitempty"`
}

func runStats(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("stats", stderr)
	var sf storeFlags
	sf.register(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	if pos, err := parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("%w: stats takes no arguments, got %q", errUsage, pos)
	}
	dialect, source, err := dialectOf(sf.dsn)
	if err != nil {
		return err
	}
	var db *sql.DB
	if dialect == sqldedup.SQLite {
		if sf.schema != "" {
			return fmt.Errorf("%w: --schema is for PostgreSQL; SQLite has none", errUsage)
		}
		table := sf.table
		if table == "" {
			table = sqldedup.DefaultTable
		}
		db, err = openSQLite(ctx, source, existingDB, table)
	} else {
		db, err = sql.Open("pgx", source)
	}
	if err != nil {
		return err
	}
	defer db.Close()
	st, err := collectStats(ctx, db, dialect, sf.schema, sf.table, time.Now())
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(stdout, st)
	}
	printStats(stdout, st)
	return nil
}

// collectStats reads the statistics of the processed-messages table.
func collectStats(ctx context.Context, db *sql.DB, dialect sqldedup.Dialect, schema, table string, now time.Time) (*tableStats, error) {
	if schema == "" {
		schema = "public"
	}
	if table == "" {
		table = "processed_messages"
	}
	st := &tableStats{At: now.UTC(), Table: table, Scopes: []scopeStats{}}
	var name, q string
	var cutoffs []any
	if dialect == sqldedup.Postgres {
		st.Schema = schema
		name = pgx.Identifier{schema, table}.Sanitize()
		var b strings.Builder
		b.WriteString(`SELECT scope, count(*), min(processed_at), max(processed_at), count(*) FILTER (WHERE expires_at <= $1)`)
		for i := range ageBuckets {
			fmt.Fprintf(&b, `, count(*) FILTER (WHERE processed_at > $%d)`, i+2)
			cutoffs = append(cutoffs, now.Add(-ageBuckets[i].max))
		}
		q = b.String() + ` FROM ` + name + ` GROUP BY scope ORDER BY scope`
		cutoffs = append([]any{now}, cutoffs...)
	} else {
		name = `"` + strings.ReplaceAll(table, `"`, `""`) + `"`
		var b strings.Builder
		b.WriteString(`SELECT scope, count(*), min(processed_at), max(processed_at), sum(expires_at <= ?)`)
		for i := range ageBuckets {
			b.WriteString(`, sum(processed_at > ?)`)
			cutoffs = append(cutoffs, now.Add(-ageBuckets[i].max).UnixMicro())
		}
		q = b.String() + ` FROM ` + name + ` GROUP BY scope ORDER BY scope`
		cutoffs = append([]any{now.UnixMicro()}, cutoffs...)
	}
	rows, err := db.QueryContext(ctx, q, cutoffs...)
	if isNoTable(err) {
		return nil, &noTableError{Table: strings.ReplaceAll(name, `"`, "")}
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	defer rows.Close()
	for rows.Next() {
		var s scopeStats
		younger := make([]int64, len(ageBuckets))
		dest := []any{&s.Scope, &s.Records, nil, nil, &s.Expired}
		var oldestT, newestT time.Time
		var oldestU, newestU int64
		if dialect == sqldedup.Postgres {
			dest[2], dest[3] = &oldestT, &newestT
		} else {
			dest[2], dest[3] = &oldestU, &newestU
		}
		for i := range younger {
			dest = append(dest, &younger[i])
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		if dialect != sqldedup.Postgres {
			oldestT, newestT = time.UnixMicro(oldestU), time.UnixMicro(newestU)
		}
		s.Oldest, s.Newest = oldestT.UTC(), newestT.UTC()
		// younger[i] counts records newer than bound i: cumulative.
		s.Ages = map[string]int64{}
		prev := int64(0)
		for i, b := range ageBuckets {
			s.Ages[b.name] = younger[i] - prev
			prev = younger[i]
		}
		s.Ages[">=7d"] = s.Records - prev
		st.Total += s.Records
		st.Scopes = append(st.Scopes, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	var tableBytes, indexBytes sql.NullInt64
	if dialect == sqldedup.Postgres {
		err := db.QueryRowContext(ctx, `SELECT pg_table_size(to_regclass($1)), pg_indexes_size(to_regclass($1))`, name).Scan(&tableBytes, &indexBytes)
		if err != nil {
			return nil, fmt.Errorf("size of %s: %w", name, err)
		}
	} else {
		// dbstat is compiled into the SQLite driver; without it the
		// sizes stay unknown (null).
		_ = db.QueryRowContext(ctx, `SELECT (SELECT sum(pgsize) FROM dbstat WHERE name = ?1),
			(SELECT coalesce(sum(d.pgsize), 0) FROM dbstat d JOIN sqlite_master m ON m.name = d.name WHERE m.type = 'index' AND m.tbl_name = ?1)`,
			table).Scan(&tableBytes, &indexBytes)
	}
	if tableBytes.Valid && indexBytes.Valid {
		st.TableBytes, st.IndexBytes = &tableBytes.Int64, &indexBytes.Int64
	}
	if st.Outbox, err = collectOutboxStats(ctx, db, dialect, schema); err != nil {
		return nil, err
	}
	return st, nil
}

// collectOutboxStats counts the outbox table's rows by state, and returns
// nil when the schema (or SQLite file) has no outbox table.
func collectOutboxStats(ctx context.Context, db *sql.DB, dialect sqldedup.Dialect, schema string) (*outboxStats, error) {
	var name, exists, q string
	// States: 0 pending, 1 sent, 2 parked (sinks/outbox).
	if dialect == sqldedup.Postgres {
		name = pgx.Identifier{schema, outbox.Table}.Sanitize()
		exists = `SELECT to_regclass($1) IS NOT NULL`
		q = `SELECT count(*) FILTER (WHERE state = 0), count(*) FILTER (WHERE state = 1), count(*) FILTER (WHERE state = 2),
			min(created_at) FILTER (WHERE state = 0), min(created_at) FILTER (WHERE state = 2) FROM ` + name
	} else {
		name = outbox.Table
		exists = `SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?`
		q = `SELECT coalesce(sum(state = 0), 0), coalesce(sum(state = 1), 0), coalesce(sum(state = 2), 0),
			min(CASE WHEN state = 0 THEN created_at END), min(CASE WHEN state = 2 THEN created_at END) FROM ` + name
	}
	var ok bool
	if err := db.QueryRowContext(ctx, exists, name).Scan(&ok); err != nil {
		return nil, fmt.Errorf("look for %s: %w", name, err)
	}
	if !ok {
		return nil, nil
	}
	o := &outboxStats{Table: outbox.Table}
	var pendingT, parkedT sql.NullTime
	var pendingMs, parkedMs sql.NullInt64 // SQLite: Unix milliseconds
	dest := []any{&o.Pending, &o.Sent, &o.Parked, &pendingT, &parkedT}
	if dialect != sqldedup.Postgres {
		dest[3], dest[4] = &pendingMs, &parkedMs
	}
	if err := db.QueryRowContext(ctx, q).Scan(dest...); err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	at := func(t sql.NullTime, ms sql.NullInt64) *time.Time {
		switch {
		case t.Valid:
			u := t.Time.UTC()
			return &u
		case ms.Valid:
			u := time.UnixMilli(ms.Int64).UTC()
			return &u
		}
		return nil
	}
	o.OldestPending, o.OldestParked = at(pendingT, pendingMs), at(parkedT, parkedMs)
	return o, nil
}

func printStats(w io.Writer, st *tableStats) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "scope\trecords\texpired, not deleted\toldest\tnewest")
	for _, b := range ageBuckets {
		fmt.Fprintf(tw, "\t%s", b.name)
	}
	fmt.Fprintf(tw, "\t>=7d\n")
	for _, s := range st.Scopes {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s", s.Scope, s.Records, s.Expired,
			s.Oldest.Format(time.RFC3339), s.Newest.Format(time.RFC3339))
		for _, b := range ageBuckets {
			fmt.Fprintf(tw, "\t%d", s.Ages[b.name])
		}
		fmt.Fprintf(tw, "\t%d\n", s.Ages[">=7d"])
	}
	_ = tw.Flush()
	qualify := func(table string) string {
		if st.Schema == "" {
			return table
		}
		return st.Schema + "." + table
	}
	fmt.Fprintf(w, "\n%s: %s in %s", qualify(st.Table), plural(st.Total, "record"), plural(int64(len(st.Scopes)), "scope"))
	if st.TableBytes != nil {
		fmt.Fprintf(w, "; table %s, indexes %s", bytesString(*st.TableBytes), bytesString(*st.IndexBytes))
	}
	fmt.Fprintln(w)
	if o := st.Outbox; o != nil {
		fmt.Fprintf(w, "%s: %d pending%s, %d parked%s, %d sent\n", qualify(o.Table),
			o.Pending, oldestNote(o.OldestPending, st.At), o.Parked, oldestNote(o.OldestParked, st.At), o.Sent)
	}
}

// plural is "1 record", "2 records".
func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// oldestNote is " (oldest 3m0s ago)", or "" without a row.
func oldestNote(t *time.Time, now time.Time) string {
	if t == nil {
		return ""
	}
	return fmt.Sprintf(" (oldest %s ago)", now.Sub(*t).Round(time.Second))
}

func bytesString(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
