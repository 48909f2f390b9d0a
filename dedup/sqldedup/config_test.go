package sqldedup_test

import (
	"database/sql"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/internal/cfgerr"
)

// TestConfigErrorsNameEveryField: New reports every bad field at once, each a
// *idemq.ConfigError, and the error matches idemq.ErrInvalidConfig.
func TestConfigErrorsNameEveryField(t *testing.T) {
	db := &sql.DB{} // never used: New does not touch the database
	cases := []struct {
		name string
		db   sqldedup.DB
		cfg  sqldedup.Config
		want []string
	}{
		{"dialect and table", db, sqldedup.Config{Table: "a;b"},
			[]string{"sqldedup.Config.Dialect", "sqldedup.Config.Table"}},
		{"schema on sqlite and retention", db, sqldedup.Config{Dialect: sqldedup.SQLite, Schema: "main", Retention: -1},
			[]string{"sqldedup.Config.Schema", "sqldedup.Config.Retention"}},
		{"interval and batch", db, sqldedup.Config{Dialect: sqldedup.Postgres, CleanupInterval: -1, CleanupBatchSize: -1},
			[]string{"sqldedup.Config.CleanupInterval", "sqldedup.Config.CleanupBatchSize"}},
		{"retention below a second, as in pgdedup", db, sqldedup.Config{Dialect: sqldedup.SQLite, Retention: 500 * time.Millisecond, Table: "1t"},
			[]string{"sqldedup.Config.Table", "sqldedup.Config.Retention"}},
		{"nil db and dialect", nil, sqldedup.Config{Dialect: "mysql"},
			[]string{"sqldedup.New(db)", "sqldedup.Config.Dialect"}},
	}
	for _, tc := range cases {
		_, err := sqldedup.New(tc.db, tc.cfg)
		if !errors.Is(err, idemq.ErrInvalidConfig) {
			t.Errorf("%s: New = %v, want idemq.ErrInvalidConfig", tc.name, err)
		}
		var ce *idemq.ConfigError
		if !errors.As(err, &ce) {
			t.Errorf("%s: New = %v, want a *idemq.ConfigError", tc.name, err)
		}
		if got := cfgerr.Fields(err); !slices.Equal(got, tc.want) {
			t.Errorf("%s: New = %v, reports fields %q, want %q", tc.name, err, got, tc.want)
		}
	}
}
