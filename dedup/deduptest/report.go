package deduptest

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
)

// Reporter is a store that reads a report of its table: pgdedup and
// sqldedup.
type Reporter interface {
	Report(ctx context.Context) (dedup.TableReport, error)
}

// CheckReport checks store's Report of the table a store's test has set up
// by then: records a1, a2 and a3 committed in scope "a", with a2's
// processing time set to oldest (more than 7 days ago) and a3's to two
// hours ago, and records b1 and b2 in scope "b", b2 expired but not
// deleted. table is the table's name as the report gives it.
func CheckReport(t *testing.T, ctx context.Context, store Reporter, table string, oldest time.Time) {
	t.Helper()
	before := time.Now()
	r, err := store.Report(ctx)
	if err != nil {
		t.Fatalf("Report: %v", err)
	}
	if r.Table != table || r.At.Before(before.Add(-time.Second)) {
		t.Errorf("Report table %q at %v; want %q, now", r.Table, r.At, table)
	}
	if len(r.Scopes) != 2 || r.Scopes[0].Scope != "a" || r.Scopes[1].Scope != "b" {
		t.Fatalf("scopes %+v, want a and b", r.Scopes)
	}
	a, b := r.Scopes[0], r.Scopes[1]
	if a.Records != 3 || !a.Oldest.Equal(oldest) || a.Expired != 0 || r.At.Sub(a.Newest) > time.Minute {
		t.Errorf("scope a: %d records, oldest %v, newest %v, %d expired; want 3, %v, now, 0", a.Records, a.Oldest, a.Newest, a.Expired, oldest)
	}
	want := []dedup.AgeCount{
		{Under: time.Minute, Records: 1}, {Under: time.Hour}, {Under: 24 * time.Hour, Records: 1},
		{Under: 7 * 24 * time.Hour}, {Records: 1},
	}
	if len(a.Ages) != len(want) {
		t.Fatalf("scope a ages %v, want %v", a.Ages, want)
	}
	for i := range want {
		if a.Ages[i] != want[i] {
			t.Errorf("scope a ages %v, want %v", a.Ages, want)
			break
		}
	}
	if b.Records != 2 || b.Expired != 1 {
		t.Errorf("scope b: %d records, %d expired; want 2, 1 (the janitor has not run)", b.Records, b.Expired)
	}
	if n := a.Records + b.Records; n != 5 {
		t.Errorf("%d records in all, want 5", n)
	}
	if r.SizeKnown && (r.TableBytes <= 0 || r.IndexBytes <= 0) {
		t.Errorf("sizes: table %d, indexes %d; want both positive", r.TableBytes, r.IndexBytes)
	}
}
