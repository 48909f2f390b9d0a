package pgdedup_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/cfgerr"
)

// TestConfigErrorsNameEveryField: New reports every bad field at once, each a
// *idemq.ConfigError, and the error matches idemq.ErrInvalidConfig.
func TestConfigErrorsNameEveryField(t *testing.T) {
	cases := []struct {
		name string
		db   pgdedup.DB
		cfg  pgdedup.Config
		want []string
	}{
		{"schema and table", &pgxpool.Pool{}, pgdedup.Config{Schema: "1abc", Table: "a;b"},
			[]string{"pgdedup.Config.Schema", "pgdedup.Config.Table"}},
		{"retention and batch", &pgxpool.Pool{}, pgdedup.Config{Retention: -1, CleanupBatchSize: -1},
			[]string{"pgdedup.Config.Retention", "pgdedup.Config.CleanupBatchSize"}},
		{"nil db and interval", nil, pgdedup.Config{CleanupInterval: -1},
			[]string{"pgdedup.New(db)", "pgdedup.Config.CleanupInterval"}},
	}
	for _, tc := range cases {
		_, err := pgdedup.New(tc.db, tc.cfg)
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
