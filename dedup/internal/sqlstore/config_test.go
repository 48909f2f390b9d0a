package sqlstore

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/cfgerr"
)

func TestSettingsValidate(t *testing.T) {
	ok := Settings{Schema: "public", Postgres: true, Table: "processed_messages", Retention: time.Second, CleanupBatchSize: 1}
	for _, tc := range []struct {
		name string
		edit func(*Settings)
		want []string
	}{
		{"valid", func(*Settings) {}, nil},
		{"schema unchecked", func(s *Settings) { s.Schema, s.Postgres = "", false }, nil},
		{"schema and table", func(s *Settings) { s.Schema, s.Table = "a.b", "x;y" }, []string{"Schema", "Table"}},
		{"long names", func(s *Settings) {
			s.Schema, s.Table = strings.Repeat("s", MaxSchemaBytes+1), strings.Repeat("t", MaxTableBytes+1)
		}, []string{"Schema", "Table"}},
		{"retention below a second", func(s *Settings) { s.Retention = time.Second - time.Millisecond }, []string{"Retention"}},
		{"cleanup", func(s *Settings) { s.CleanupInterval, s.CleanupBatchSize = -1, 0 }, []string{"CleanupInterval", "CleanupBatchSize"}},
	} {
		s := ok
		tc.edit(&s)
		var l cfgerr.List
		s.Validate(&l)
		if got := cfgerr.Fields(l.Err()); !slices.Equal(got, tc.want) {
			t.Errorf("%s: fields %q, want %q (%v)", tc.name, got, tc.want, l.Err())
		}
	}
}
