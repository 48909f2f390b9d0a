package deduptest_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/dedup/memdedup"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/dedup/redisdedup"
	"github.com/idemq/idemq/dedup/sqldedup"
)

// column is one store of the capability table in dedupdriver's package
// doc: its heading and its driver's Caps, and the checks of ErrUnsupported
// for what it cannot do (no server is needed for those).
type column struct {
	heading     string
	caps        dedupdriver.Caps
	unsupported func(t *testing.T, caps dedupdriver.Caps)
}

// columns builds each store on a client that never connects (the drivers'
// Caps and their ErrUnsupported answers send nothing).
func columns(t *testing.T) []column {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	pg, err := pgdedup.New(pool, pgdedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sq, err := sqldedup.New(&sql.DB{}, sqldedup.Config{Dialect: sqldedup.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { rdb.Close() })
	rs, err := redisdedup.New(rdb, redisdedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := memdedup.New(memdedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return []column{
		{"pgdedup", pg.Driver().Caps(), txUnsupported[pgx.Tx](pg.Driver())},
		{"sqldedup", sq.Driver().Caps(), txUnsupported[*sql.Tx](sq.Driver())},
		{"redisdedup", rs.Driver().Caps(), leaseUnsupported(rs.Driver())},
		{"memdedup.Store", mem.Driver().Caps(), txUnsupported[*memdedup.Tx](mem.Driver())},
		{"memdedup.Leases", mem.Leases().Driver().Caps(), leaseUnsupported(mem.Leases().Driver())},
	}
}

// txUnsupported checks that d answers ErrUnsupported (or false, or 0) for
// every capability caps lacks.
func txUnsupported[T any](d dedupdriver.Tx[T]) func(t *testing.T, caps dedupdriver.Caps) {
	return func(t *testing.T, caps dedupdriver.Caps) {
		t.Helper()
		ctx := context.Background()
		var tx T
		recs := []dedup.Record{{Key: "k"}}
		if !caps.BeginClaim {
			_, _, err := d.BeginClaim(ctx, "s", recs)
			wantUnsupported(t, "BeginClaim", err)
		}
		if !caps.CommitChain {
			_, committed, err := d.CommitChain(ctx, tx, "s", recs)
			wantUnsupported(t, "CommitChain", err)
			if committed {
				t.Error("CommitChain without the capability reports a commit")
			}
		}
		if !caps.EndedTx {
			wantUnsupported(t, "ForgetEnded", d.ForgetEnded(ctx, tx, "s", "k", []string{"k2"}))
			if d.Ended(tx) {
				t.Error("Ended without the capability is true")
			}
		}
		if !caps.FailedTx && d.Failed(tx) {
			t.Error("Failed without the capability is true")
		}
		if !caps.Aborted && d.IsAborted(errors.New("x")) {
			t.Error("IsAborted without the capability is true")
		}
		if !caps.Transient && d.IsTransient(errors.New("x")) {
			t.Error("IsTransient without the capability is true")
		}
		if !caps.Pool && d.PoolSize() != 0 {
			t.Errorf("PoolSize without the capability is %d", d.PoolSize())
		}
		if !caps.SchemaCheck {
			wantUnsupported(t, "CheckSchema", d.CheckSchema(ctx))
		}
		if !caps.Durability {
			_, err := d.Durability(ctx)
			wantUnsupported(t, "Durability", err)
		}
	}
}

// leaseUnsupported is txUnsupported for a lease driver.
func leaseUnsupported(d dedupdriver.Lease) func(t *testing.T, caps dedupdriver.Caps) {
	return func(t *testing.T, caps dedupdriver.Caps) {
		t.Helper()
		ctx := context.Background()
		if !caps.BatchClaim {
			_, err := d.ClaimBatch(ctx, "s", []dedup.Record{{Key: "k"}}, []string{"t"}, time.Second)
			wantUnsupported(t, "ClaimBatch", err)
		}
		if !caps.SchemaCheck {
			wantUnsupported(t, "CheckSchema", d.CheckSchema(ctx))
		}
		if !caps.Durability {
			_, err := d.Durability(ctx)
			wantUnsupported(t, "Durability", err)
		}
	}
}

func wantUnsupported(t *testing.T, method string, err error) {
	t.Helper()
	if !errors.Is(err, dedupdriver.ErrUnsupported) {
		t.Errorf("%s without the capability: %v, want dedupdriver.ErrUnsupported", method, err)
	}
}

// capsCells returns the table cells of caps, by Caps field name: "x" for a
// capability it has (a Retention above 0), "." otherwise.
func capsCells(caps dedupdriver.Caps) map[string]string {
	c := func(b bool) string {
		if b {
			return "x"
		}
		return "."
	}
	return map[string]string{
		"BeginClaim": c(caps.BeginClaim), "CommitChain": c(caps.CommitChain), "Aborted": c(caps.Aborted),
		"FailedTx": c(caps.FailedTx), "EndedTx": c(caps.EndedTx), "Transient": c(caps.Transient),
		"Pool": c(caps.Pool), "Retention": c(caps.Retention > 0), "SchemaCheck": c(caps.SchemaCheck),
		"FailureCount": c(caps.FailureCount), "Results": c(caps.Results), "BatchClaim": c(caps.BatchClaim),
		"Durability": c(caps.Durability),
	}
}

// docTable parses the capability table of dedupdriver's package doc: the
// indented block whose first row starts with "Caps". It returns the column
// headings after the first two words and, per Caps field, the cells.
func docTable(t *testing.T) (headings []string, rows map[string][]string, order []string) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("..", "dedupdriver", "dedupdriver.go"))
	if err != nil {
		t.Fatal(err)
	}
	rows = map[string][]string{}
	in := false
	for _, line := range strings.Split(string(src), "\n") {
		cells := strings.Fields(strings.TrimPrefix(line, "//"))
		if !in {
			if strings.HasPrefix(line, "//\t") && len(cells) > 2 && cells[0] == "Caps" && cells[1] == "field" {
				headings, in = cells[2:], true
			}
			continue
		}
		if !strings.HasPrefix(line, "//\t") || len(cells) == 0 {
			break
		}
		if len(cells) != len(headings)+1 {
			t.Fatalf("dedupdriver: table row %q has %d cells, want %d", line, len(cells), len(headings)+1)
		}
		rows[cells[0]] = cells[1:]
		order = append(order, cells[0])
	}
	if headings == nil {
		t.Fatal(`dedupdriver: no capability table (an indented block starting with "Caps field")`)
	}
	return headings, rows, order
}

// The table in dedupdriver's package doc of which store's driver can do
// what says what the drivers' Caps say, has a row per Caps field, and each
// driver answers ErrUnsupported for what its Caps lacks.
func TestCapabilityTableMatchesDrivers(t *testing.T) {
	headings, rows, order := docTable(t)
	cols := columns(t)
	var want []string
	for _, c := range cols {
		want = append(want, c.heading)
	}
	if !slices.Equal(headings, want) {
		t.Fatalf("dedupdriver: table columns %q, want %q", headings, want)
	}
	fields := capsCells(dedupdriver.Caps{})
	if len(order) != len(fields) {
		t.Errorf("dedupdriver: table rows %q, want one per Caps field (%d)", order, len(fields))
	}
	for i, c := range cols {
		cells := capsCells(c.caps)
		for _, name := range order {
			got, ok := cells[name]
			if !ok {
				t.Errorf("dedupdriver: row %s names no Caps field", name)
				continue
			}
			if rows[name][i] != got {
				t.Errorf("dedupdriver: row %s, column %s says %q, but the driver's Caps says %q", name, c.heading, rows[name][i], got)
			}
		}
		t.Run(c.heading, func(t *testing.T) { c.unsupported(t, c.caps) })
	}
}
