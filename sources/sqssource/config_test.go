package sqssource_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/cfgerr"
	"github.com/idemq/idemq/sources/sqssource"
)

// TestConfigErrorsNameEveryField: New reports every bad argument and field at
// once, each a *idemq.ConfigError matching idemq.ErrInvalidConfig,
// before it calls SQS.
func TestConfigErrorsNameEveryField(t *testing.T) {
	cases := []struct {
		name string
		cfg  sqssource.Config
		want []string
	}{
		{"client, queue and wait", sqssource.Config{WaitTime: 21 * time.Second},
			[]string{"sqssource.New(client)", "sqssource.Config.QueueURL", "sqssource.Config.WaitTime"}},
		{"client, visibility and attempts", sqssource.Config{QueueURL: "q", VisibilityTimeout: 1500 * time.Millisecond, DeleteAttempts: -1},
			[]string{"sqssource.New(client)", "sqssource.Config.VisibilityTimeout", "sqssource.Config.DeleteAttempts"}},
	}
	for _, tc := range cases {
		_, err := sqssource.New(context.Background(), nil, tc.cfg)
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

// TestDeadLetterMetadataNames: the dead-letter attributes are the names
// defined once in consumer.
func TestDeadLetterMetadataNames(t *testing.T) {
	for got, want := range map[string]string{
		consumer.MetaReason:   consumer.MetaReason,
		consumer.MetaAttempts: consumer.MetaAttempts,
	} {
		if got != want {
			t.Errorf("attribute %q, want %q", got, want)
		}
	}
}
