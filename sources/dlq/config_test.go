package dlq_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/sources/dlq/amqpdlq"
	"github.com/idemq/idemq/sources/dlq/kafkadlq"
	"github.com/idemq/idemq/sources/dlq/sqsdlq"
)

// Each broker's New refuses a configuration without its required fields
// with one *idemq.ConfigError per field.
func TestNewRefusesMissingFields(t *testing.T) {
	for name, tc := range map[string]struct {
		err    error
		fields []string
	}{
		"kafka": {err: second(kafkadlq.New(kafkadlq.Config{})), fields: []string{"kafkadlq.Config.Brokers", "kafkadlq.Config.Topic"}},
		"amqp":  {err: second(amqpdlq.New(amqpdlq.Config{})), fields: []string{"amqpdlq.Config.URL", "amqpdlq.Config.Queue"}},
		"sqs":   {err: second(sqsdlq.New(sqsdlq.Config{})), fields: []string{"sqsdlq.Config.Client", "sqsdlq.Config.QueueURL"}},
	} {
		t.Run(name, func(t *testing.T) {
			if !errors.Is(tc.err, idemq.ErrInvalidConfig) {
				t.Fatalf("New(Config{}) = %v, want an error matching idemq.ErrInvalidConfig", tc.err)
			}
			var ce *idemq.ConfigError
			if !errors.As(tc.err, &ce) {
				t.Fatalf("New(Config{}) = %v, want a *idemq.ConfigError", tc.err)
			}
			for _, f := range tc.fields {
				if !strings.Contains(tc.err.Error(), f) {
					t.Errorf("New(Config{}) = %v, want it to name %s", tc.err, f)
				}
			}
		})
	}
}

func second[T any](_ T, err error) error { return err }
