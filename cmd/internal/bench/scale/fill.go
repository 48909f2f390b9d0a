package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/cmd/internal/bench/pgload"
)

// fillScopes are the scopes of the filled records, one after another; the
// Runner claims in the first.
var fillScopes = []string{"orders", "payments", "shipping", "refunds"}

// pgEpoch is the origin of PostgreSQL's binary timestamps.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// plan dates the filled records: days days of perDay records each (the
// last day takes the remainder), processed over the UTC days before the
// fill's; with expiry set, day k < cycles expires at expiry(k), the others
// days after the run, else every record expires a retention (days) after
// it was processed.
type plan struct {
	rows, days, cycles int
	start              time.Time                // the fill's start
	expiry             func(day int) time.Time  // day < cycles; nil: processed + days
	firstExpiry        func(rowsLeft int) error // called once, before the first expiring row
}

func (p plan) perDay() int { return p.rows / p.days }

func (p plan) dayRows(d int) int {
	if d == p.days-1 {
		return p.rows - p.perDay()*(p.days-1)
	}
	return p.perDay()
}

// dayStart is the start of day d (UTC midnight); day days is the fill's.
func (p plan) dayStart(d int) time.Time {
	return p.start.UTC().Truncate(24 * time.Hour).Add(time.Duration(d-p.days) * 24 * time.Hour)
}

// order is the order the days are written in: with expiry, the days that
// do not expire in the run first, so that the expiry of the others can be
// chosen as late as possible (see firstExpiry), then the expiring ones,
// oldest first; else oldest first.
func (p plan) order() []int {
	var o []int
	first := 0
	if p.expiry != nil {
		first = p.cycles
	}
	for d := first; d < p.days; d++ {
		o = append(o, d)
	}
	for d := range first {
		o = append(o, d)
	}
	return o
}

// copyRows writes the records of days (of p) as COPY's binary format:
// random UUID keys, the scopes in turn, random 32-byte payload hashes.
func copyRows(w io.Writer, p plan, days []int, seed uint64) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	rnd := rand.New(rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16), byte(seed >> 24)}))
	var hdr [19]byte
	copy(hdr[:], "PGCOPY\n\xff\r\n\x00")
	if _, err := bw.Write(hdr[:]); err != nil {
		return err
	}
	var raw [48]byte
	row := make([]byte, 0, 160)
	written := 0
	day := 24 * time.Hour
	for _, d := range days {
		n := p.dayRows(d)
		dated := p.expiry != nil && d < p.cycles
		var exp0 time.Time
		if dated {
			if d == 0 && p.firstExpiry != nil {
				if err := p.firstExpiry(p.rows - written); err != nil {
					return err
				}
			}
			exp0 = p.expiry(d)
		}
		dayStart := p.dayStart(d)
		step := day / time.Duration(n)
		for j := range n {
			for k := 0; k < len(raw); k += 8 {
				binary.LittleEndian.PutUint64(raw[k:], rnd.Uint64())
			}
			processed := dayStart.Add(time.Duration(j) * step)
			expires := processed.Add(time.Duration(p.days) * day)
			if dated {
				// The whole day expires within the second before its
				// rollover, in processing order.
				expires = exp0.Add(-time.Second + time.Duration(int64(j)*int64(time.Second)/int64(n)))
			}
			sc := fillScopes[(written+j)%len(fillScopes)]
			row = row[:0]
			row = binary.BigEndian.AppendUint16(row, 5)
			row = appendField(row, []byte(sc))
			row = appendField(row, []byte(pgload.UUID(raw[:16])))
			row = appendField(row, raw[16:48])
			row = binary.BigEndian.AppendUint32(row, 8)
			row = binary.BigEndian.AppendUint64(row, uint64(processed.Sub(pgEpoch).Microseconds()))
			row = binary.BigEndian.AppendUint32(row, 8)
			row = binary.BigEndian.AppendUint64(row, uint64(expires.Sub(pgEpoch).Microseconds()))
			if _, err := bw.Write(row); err != nil {
				return err
			}
		}
		written += n
	}
	if _, err := bw.Write([]byte{0xff, 0xff}); err != nil {
		return err
	}
	return bw.Flush()
}

func appendField(b, v []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
	return append(b, v...)
}

// copyIn runs setup and one COPY … FREEZE of the records of days into
// table in one transaction on conn: FREEZE needs setup to create or
// truncate table, and then, with wal_level=minimal, the load writes no
// WAL, and its rows are loaded frozen and all-visible, as VACUUM would
// leave them.
func copyIn(ctx context.Context, conn *pgxpool.Conn, setup []string, table string, p plan, days []int) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
	if err := execAll(ctx, tx, setup...); err != nil {
		return err
	}
	want := 0
	for _, d := range days {
		want += p.dayRows(d)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(copyRows(pw, p, days, uint64(time.Now().UnixNano()))) }()
	tag, err := conn.Conn().PgConn().CopyFrom(ctx, pr,
		`COPY `+table+` (scope, key, payload_hash, processed_at, expires_at) FROM STDIN WITH (FORMAT binary, FREEZE)`)
	_ = pr.CloseWithError(io.ErrClosedPipe)
	if err != nil {
		return fmt.Errorf("copy into %s: %w", table, err)
	}
	if tag.RowsAffected() != int64(want) {
		return fmt.Errorf("copy into %s: %d rows, want %d", table, tag.RowsAffected(), want)
	}
	return tx.Commit(ctx)
}

func execAll(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, sqls ...string) error {
	for _, sql := range sqls {
		if _, err := db.Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", strings.SplitN(sql, "\n", 2)[0], err)
		}
	}
	return nil
}

// fillTable loads p into today's table (schema-qualified), its primary key
// dropped for the load and built after it, in one COPY. The BRIN expiry
// index is kept and its ranges summarized after the load.
func fillTable(ctx context.Context, pool *pgxpool.Pool, table, brin string, p plan) (copyTime, indexTime time.Duration, err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Release()
	start := time.Now()
	if err := copyIn(ctx, conn, []string{`TRUNCATE ` + table, `ALTER TABLE ` + table + ` DROP CONSTRAINT processed_messages_pkey`}, table, p, p.order()); err != nil {
		return 0, 0, err
	}
	copyTime = time.Since(start)
	start = time.Now()
	err = execAll(ctx, conn,
		`ALTER TABLE `+table+` ADD CONSTRAINT processed_messages_pkey PRIMARY KEY (scope, key)`,
		`SELECT brin_summarize_new_values('`+brin+`')`,
		`ANALYZE `+table)
	return copyTime, time.Since(start), err
}

// fillPartitions loads p into the partitioned table (schema.table), one
// partition per day named as pgdedup's janitor names them, in place of the
// migration's empty ones: each created with its bounds as a CHECK
// constraint and loaded by one COPY, then its primary key built and the
// partition attached (the CHECK spares the attach a scan of it; it is
// dropped after). The janitor's first Cleanup creates today's and the
// next days'.
func fillPartitions(ctx context.Context, pool *pgxpool.Pool, schema, table string, p plan) (copyTime, indexTime time.Duration, err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Release()
	parent := pgx.Identifier{schema, table}.Sanitize()
	// The migration's partitions are empty; some may cover the fill's
	// days (the table it partitioned covers every time before its cut).
	rows, err := conn.Query(ctx, `SELECT format('%I.%I', n.nspname, c.relname) FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE i.inhparent = $1::regclass`, parent)
	if err != nil {
		return 0, 0, err
	}
	old, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, 0, err
	}
	for _, o := range old {
		if err := execAll(ctx, conn, `DROP TABLE `+o); err != nil {
			return 0, 0, err
		}
	}
	for _, d := range p.order() {
		lo, hi := p.dayStart(d), p.dayStart(d+1)
		name := table + "_p" + lo.Format("20060102")
		part := pgx.Identifier{schema, name}.Sanitize()
		from, to := `'`+lo.Format(time.RFC3339)+`'`, `'`+hi.Format(time.RFC3339)+`'`
		start := time.Now()
		err := copyIn(ctx, conn, []string{fmt.Sprintf(`CREATE TABLE %s (LIKE %s INCLUDING DEFAULTS,
CONSTRAINT bounds CHECK (processed_at >= %s AND processed_at < %s))`, part, parent, from, to)}, part, p, []int{d})
		if err != nil {
			return 0, 0, err
		}
		copyTime += time.Since(start)
		start = time.Now()
		err = execAll(ctx, conn,
			`ALTER TABLE `+part+` ADD PRIMARY KEY (scope, key, processed_at)`,
			`ALTER TABLE `+parent+` ATTACH PARTITION `+part+` FOR VALUES FROM (`+from+`) TO (`+to+`)`,
			`ALTER TABLE `+part+` DROP CONSTRAINT bounds`,
			`ANALYZE `+part)
		if err != nil {
			return 0, 0, err
		}
		indexTime += time.Since(start)
	}
	return copyTime, indexTime, nil
}
