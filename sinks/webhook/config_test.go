package webhook_test

import (
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/cfgerr"
	"github.com/idemq/idemq/sinks/webhook"
)

// TestConfigErrorsNameEveryField: New reports every bad field at once, each a
// *idemq.ConfigError, and the error matches idemq.ErrInvalidConfig.
func TestConfigErrorsNameEveryField(t *testing.T) {
	cases := []struct {
		name string
		cfg  webhook.Config
		want []string
	}{
		{"no URL and GET", webhook.Config{Method: http.MethodGet},
			[]string{"webhook.Config.URL", "webhook.Config.Method"}},
		{"key header and header", webhook.Config{URL: "http://127.0.0.1/hook", KeyHeader: "a b", Header: http.Header{"X": {"a\nb"}}},
			[]string{"webhook.Config.KeyHeader", "webhook.Config.Header"}},
		{"scheme and timeouts", webhook.Config{URL: "ftp://127.0.0.1/hook", Timeout: -time.Second, MaxRetryAfter: -time.Second},
			[]string{"webhook.Config.URL", "webhook.Config.Timeout", "webhook.Config.MaxRetryAfter"}},
	}
	for _, tc := range cases {
		_, err := webhook.New(tc.cfg)
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
	if _, err := webhook.New(webhook.Config{URL: "http://127.0.0.1/hook", Header: http.Header{"X": {"a\nb"}}}); !errors.Is(err, webhook.ErrInvalidHeader) {
		t.Errorf("New with a bad Header = %v, want it to wrap ErrInvalidHeader", err)
	}
}
