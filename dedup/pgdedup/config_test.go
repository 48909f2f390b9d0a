package pgdedup_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/cfgerr"
)

// TestConfigErrorsNameEveryField: New reports every bad field at once, each a
// *consumer.ConfigError, and the error matches consumer.ErrInvalidConfig as
// well as the package's own ErrInvalidConfig.
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
		if !errors.Is(err, consumer.ErrInvalidConfig) || !errors.Is(err, pgdedup.ErrInvalidConfig) {
			t.Errorf("%s: New = %v, want consumer.ErrInvalidConfig and pgdedup.ErrInvalidConfig", tc.name, err)
		}
		var ce *consumer.ConfigError
		if !errors.As(err, &ce) {
			t.Errorf("%s: New = %v, want a *consumer.ConfigError", tc.name, err)
		}
		if got := cfgerr.Fields(err); !slices.Equal(got, tc.want) {
			t.Errorf("%s: New = %v, reports fields %q, want %q", tc.name, err, got, tc.want)
		}
	}
}
