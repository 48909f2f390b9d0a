package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/cmd/internal/bench/pgload"
)

// fillScopes are the scopes of the filled records, one after another; the
// Runner claims in the first.
var fillScopes = []string{"orders", "payments", "shipping", "refunds"}

// pgEpoch is the origin of PostgreSQL's binary timestamps.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// plan dates the filled records: days days of perDay records each (the
// last day takes the remainder), processed over the days before the fill;
// day k < cycles expires at expiry(k), the others days after the run.
type plan struct {
	rows, days, cycles int
	start              time.Time                // the fill's start
	expiry             func(day int) time.Time  // day < cycles
	firstExpiry        func(rowsLeft int) error // called once, before the first expiring row
}

func (p plan) perDay() int { return p.rows / p.days }

func (p plan) dayRows(d int) int {
	if d == p.days-1 {
		return p.rows - p.perDay()*(p.days-1)
	}
	return p.perDay()
}

// order is the order the days are written in: the days that do not expire
// in the run first, so that the expiry of the others can be chosen as late
// as possible (see firstExpiry), then the expiring ones, oldest first.
func (p plan) order() []int {
	var o []int
	for d := p.cycles; d < p.days; d++ {
		o = append(o, d)
	}
	for d := range p.cycles {
		o = append(o, d)
	}
	return o
}

// copyRows writes p's records as COPY's binary format: random UUID keys,
// the scopes in turn, random 32-byte payload hashes.
func copyRows(w io.Writer, p plan, seed uint64) error {
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
	for _, d := range p.order() {
		n := p.dayRows(d)
		var exp0 time.Time
		if d < p.cycles {
			if d == 0 && p.firstExpiry != nil {
				if err := p.firstExpiry(p.rows - written); err != nil {
					return err
				}
			}
			exp0 = p.expiry(d)
		}
		dayStart := p.start.Add(time.Duration(d-p.days) * day)
		for j := range n {
			for k := 0; k < len(raw); k += 8 {
				binary.LittleEndian.PutUint64(raw[k:], rnd.Uint64())
			}
			processed := dayStart.Add(time.Duration(int64(j) * int64(day) / int64(n)))
			expires := processed.Add(time.Duration(p.days) * day)
			if d < p.cycles {
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

// copyFreeze loads p into table (schema-qualified, its primary key dropped
// for the load and built after it) with one COPY … FREEZE in the
// transaction that truncates it: with wal_level=minimal that writes no WAL,
// and the rows are loaded frozen and all-visible, as VACUUM would leave
// them. The BRIN expiry index is kept and its ranges summarized after the
// load.
func copyFreeze(ctx context.Context, pool *pgxpool.Pool, table, brin string, p plan) (copyTime, indexTime time.Duration, err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Release()
	start := time.Now()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
	for _, sql := range []string{`TRUNCATE ` + table, `ALTER TABLE ` + table + ` DROP CONSTRAINT processed_messages_pkey`} {
		if _, err := tx.Exec(ctx, sql); err != nil {
			return 0, 0, fmt.Errorf("%s: %w", sql, err)
		}
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(copyRows(pw, p, uint64(start.UnixNano()))) }()
	tag, err := conn.Conn().PgConn().CopyFrom(ctx, pr,
		`COPY `+table+` (scope, key, payload_hash, processed_at, expires_at) FROM STDIN WITH (FORMAT binary, FREEZE)`)
	_ = pr.CloseWithError(io.ErrClosedPipe)
	if err != nil {
		return 0, 0, fmt.Errorf("copy: %w", err)
	}
	if tag.RowsAffected() != int64(p.rows) {
		return 0, 0, fmt.Errorf("copy: %d rows, want %d", tag.RowsAffected(), p.rows)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, err
	}
	copyTime = time.Since(start)
	start = time.Now()
	for _, sql := range []string{
		`ALTER TABLE ` + table + ` ADD CONSTRAINT processed_messages_pkey PRIMARY KEY (scope, key)`,
		`SELECT brin_summarize_new_values('` + brin + `')`,
		`ANALYZE ` + table,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return copyTime, 0, fmt.Errorf("%s: %w", sql, err)
		}
	}
	return copyTime, time.Since(start), nil
}
