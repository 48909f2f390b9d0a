package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup/migrate"
)

// countsSQL returns the statement that counts the rows of the table per
// state, with the ages in milliseconds of the oldest pending and the
// oldest parked row (0 without one).
func countsSQL(d dialect) string {
	age := func(state int) string {
		return "coalesce(" + d.millisSince(fmt.Sprintf("min(created_at) FILTER (WHERE state = %d)", state)) + ", 0)"
	}
	return fmt.Sprintf(`SELECT count(*) FILTER (WHERE state = %[1]d), count(*) FILTER (WHERE state = %[1]d AND attempts > 0),
		count(*) FILTER (WHERE state = %[2]d), count(*) FILTER (WHERE state = %[3]d), %[4]s, %[5]s FROM %[6]s`,
		statePending, stateSent, stateParked, age(statePending), age(stateParked), d.table)
}

// scanCounts reads the row of countsSQL into c.
func scanCounts(scan func(dest ...any) error, c *Counts) error {
	var pending, parked int64
	if err := scan(&c.Pending, &c.Failing, &c.Sent, &c.Parked, &pending, &parked); err != nil {
		return err
	}
	c.OldestPending = time.Duration(pending) * time.Millisecond
	c.OldestParked = time.Duration(parked) * time.Millisecond
	return nil
}

// Counts returns the number of rows per state of the outbox table in
// schema s, through db, a database/sql handle of dialect d, without a
// Relay: what `idemq stats` shows. It reads the table without locking it.
// It returns the database's error when the table does not exist.
func (s Schema) Counts(ctx context.Context, db SQLQuerier, d migrate.Dialect) (Counts, error) {
	switch {
	case d == migrate.SQLite && s != "":
		return Counts{}, &idemq.ConfigError{Field: "outbox.Schema", Reason: fmt.Sprintf("%q: SQLite has no schemas", string(s))}
	case d != migrate.SQLite && d != migrate.Postgres:
		return Counts{}, &idemq.ConfigError{Field: "outbox.Schema.Counts(d)", Reason: fmt.Sprintf("unknown dialect %q", d)}
	}
	dl := sqlite
	if d == migrate.Postgres {
		dl = postgres(s.table())
	}
	var c Counts
	err := scanCounts(db.QueryRowContext(ctx, countsSQL(dl)).Scan, &c)
	return c, err
}
