package redisdedup_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/dedup/redisdedup"
	"github.com/idemq/idemq/internal/cfgerr"
)

// TestConfigErrorsNameEveryField: New reports every bad field at once, each a
// *idemq.ConfigError, and the error matches idemq.ErrInvalidConfig.
func TestConfigErrorsNameEveryField(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	cases := []struct {
		name string
		rdb  redis.UniversalClient
		cfg  redisdedup.Config
		want []string
	}{
		{"prefix and result limit", rdb, redisdedup.Config{Prefix: "a{1}", MaxResultBytes: -1},
			[]string{"redisdedup.Config.Prefix", "redisdedup.Config.MaxResultBytes"}},
		{"nil client and retention", nil, redisdedup.Config{FailureRetention: -1},
			[]string{"redisdedup.New(rdb)", "redisdedup.Config.FailureRetention"}},
	}
	for _, tc := range cases {
		_, err := redisdedup.New(tc.rdb, tc.cfg)
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
