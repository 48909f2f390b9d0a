package main

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"
)

// TestCopyRowsDatesEachDay reads back the COPY stream of a fill: every
// record has a 36-byte key and a 32-byte hash, lies in its day, and expires
// a retention after it was processed, except the rolled-over days', which
// expire in the second before their rollover. The days hold over 106,752
// records each, where a day's offset in nanoseconds times the record's
// index overflows int64.
func TestCopyRowsDatesEachDay(t *testing.T) {
	const days, perDay, cycles = 8, 150_000, 3
	start := time.Date(2026, 12, 3, 11, 30, 0, 0, time.UTC)
	e0 := start.Add(time.Hour)
	p := plan{rows: days * perDay, days: days, cycles: cycles, start: start,
		expiry: func(d int) time.Time { return e0.Add(time.Duration(d) * time.Minute) }}
	var firstCalls, leftAtFirst int
	p.firstExpiry = func(left int) error { firstCalls++; leftAtFirst = left; return nil }
	var buf bytes.Buffer
	if err := copyRows(&buf, p, p.order(), 1); err != nil {
		t.Fatal(err)
	}
	if firstCalls != 1 || leftAtFirst != cycles*perDay {
		t.Fatalf("firstExpiry called %d times with %d records left, want once with %d", firstCalls, leftAtFirst, cycles*perDay)
	}
	b := buf.Bytes()
	if len(b) < 19 || string(b[:11]) != "PGCOPY\n\xff\r\n\x00" {
		t.Fatalf("no COPY header")
	}
	b = b[19:]
	u16 := func() uint16 {
		v := binary.BigEndian.Uint16(b)
		b = b[2:]
		return v
	}
	field := func() []byte {
		n := binary.BigEndian.Uint32(b)
		v := b[4 : 4+n]
		b = b[4+n:]
		return v
	}
	ts := func(b []byte) time.Time {
		return pgEpoch.Add(time.Duration(int64(binary.BigEndian.Uint64(b))) * time.Microsecond)
	}
	keys := map[string]bool{}
	for i, d := range p.order() {
		lo, hi := start.Truncate(24*time.Hour).AddDate(0, 0, d-days), start.Truncate(24*time.Hour).AddDate(0, 0, d-days+1)
		for j := range perDay {
			if n := u16(); n != 5 {
				t.Fatalf("day %d (written %d.) record %d: %d fields, want 5", d, i+1, j, n)
			}
			scope, key, hash := field(), field(), field()
			processed, expires := ts(field()), ts(field())
			if len(scope) == 0 || len(key) != 36 || len(hash) != 32 || keys[string(key)] {
				t.Fatalf("day %d record %d: scope %q, key %q, hash of %d bytes (or the key repeats)", d, j, scope, key, len(hash))
			}
			keys[string(key)] = true
			if processed.Before(lo) || !processed.Before(hi) {
				t.Fatalf("day %d record %d processed at %s, outside [%s, %s)", d, j, processed, lo, hi)
			}
			want := processed.AddDate(0, 0, days)
			if d < cycles {
				at := p.expiry(d)
				if expires.Before(at.Add(-time.Second)) || !expires.Before(at) {
					t.Fatalf("day %d record %d expires at %s, want within the second before %s", d, j, expires, at)
				}
			} else if !expires.Equal(want) {
				t.Fatalf("day %d record %d expires at %s, want %s", d, j, expires, want)
			}
		}
	}
	if n := u16(); n != 0xffff || len(b) != 0 {
		t.Fatalf("trailer %#x with %d bytes after it", n, len(b))
	}
}
