package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/sinks/outbox"
)

// ageColumns are the age buckets of the stores' reports
// (dedup.ScopeReport.Ages), as ageName names them.
var ageColumns = []string{"<1m", "<1h", "<1d", "<7d", ">=7d"}

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
	if dialect == sqldedup.SQLite && sf.schema != "" {
		return fmt.Errorf("%w: --schema is for PostgreSQL; SQLite has none", errUsage)
	}
	cfg := sqldedup.Config{Dialect: dialect, Schema: sf.schema, Table: sf.table}
	// Validate the names before any connection or file is made.
	store, err := sqldedup.New(&sql.DB{}, cfg)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	db, err := openSQL(ctx, dialect, source, existingDB, tableName(store.Config()))
	if err != nil {
		return err
	}
	defer db.Close()
	if store, err = sqldedup.New(db, cfg); err != nil {
		return err
	}
	st, err := collectStats(ctx, store, db)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(stdout, st)
	}
	printStats(stdout, st)
	return nil
}

// collectStats reads the report of store's table and the counts of the
// outbox table in its schema (or SQLite file) through db, store's database.
func collectStats(ctx context.Context, store *sqldedup.Store, db *sql.DB) (*tableStats, error) {
	c := store.Config()
	r, err := store.Report(ctx)
	if isNoTable(err) {
		return nil, &noTableError{Table: tableName(c)}
	}
	if err != nil {
		return nil, err
	}
	st := &tableStats{At: r.At, Table: c.Table, Scopes: []scopeStats{}}
	var schema outbox.Schema
	if c.Dialect == sqldedup.Postgres {
		st.Schema = c.Schema
		schema = outbox.Schema(c.Schema)
	}
	for _, sc := range r.Scopes {
		s := scopeStats{Scope: sc.Scope, Records: sc.Records, Oldest: sc.Oldest, Newest: sc.Newest, Expired: sc.Expired, Ages: map[string]int64{}}
		for i, a := range sc.Ages {
			s.Ages[ageName(sc.Ages, i)] = a.Records
		}
		st.Scopes = append(st.Scopes, s)
		st.Total += s.Records
	}
	if r.SizeKnown {
		st.TableBytes, st.IndexBytes = &r.TableBytes, &r.IndexBytes
	}
	counts, err := schema.Counts(ctx, db, c.Dialect)
	switch {
	case isNoTable(err):
		return st, nil
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", outbox.Table, err)
	}
	o := &outboxStats{Table: outbox.Table, Pending: counts.Pending, Sent: counts.Sent, Parked: counts.Parked}
	since := func(n int64, age time.Duration) *time.Time {
		if n == 0 {
			return nil
		}
		t := st.At.Add(-age)
		return &t
	}
	o.OldestPending, o.OldestParked = since(counts.Pending, counts.OldestPending), since(counts.Parked, counts.OldestParked)
	st.Outbox = o
	return st, nil
}

// ageName names bucket i of ages as `idemq stats` shows it: "<1m", "<1h",
// "<1d", "<7d", and ">=7d" for the last.
func ageName(ages []dedup.AgeCount, i int) string {
	short := func(d time.Duration) string {
		switch {
		case d%(24*time.Hour) == 0:
			return fmt.Sprintf("%dd", d/(24*time.Hour))
		case d%time.Hour == 0:
			return fmt.Sprintf("%dh", d/time.Hour)
		}
		return fmt.Sprintf("%dm", d/time.Minute)
	}
	if u := ages[i].Under; u > 0 {
		return "<" + short(u)
	}
	if i == 0 {
		return "all"
	}
	return ">=" + short(ages[i-1].Under)
}

func printStats(w io.Writer, st *tableStats) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "scope\trecords\texpired, not deleted\toldest\tnewest")
	for _, b := range ageColumns {
		fmt.Fprintf(tw, "\t%s", b)
	}
	fmt.Fprintln(tw)
	for _, s := range st.Scopes {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s", s.Scope, s.Records, s.Expired,
			s.Oldest.Format(time.RFC3339), s.Newest.Format(time.RFC3339))
		for _, b := range ageColumns {
			fmt.Fprintf(tw, "\t%d", s.Ages[b])
		}
		fmt.Fprintln(tw)
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
