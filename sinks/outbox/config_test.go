package outbox_test

import (
	"database/sql"
	"errors"
	"slices"
	"testing"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/cfgerr"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/amqpoutbox"
	"github.com/idemq/idemq/sinks/outbox/kafkaoutbox"
	"github.com/idemq/idemq/sinks/outbox/sqsoutbox"
)

// TestConfigErrorsNameEveryField: the relay constructors report every bad
// argument and field at once, each a *idemq.ConfigError, and the error
// matches idemq.ErrInvalidConfig; so
// do the publishers' constructors.
func TestConfigErrorsNameEveryField(t *testing.T) {
	check := func(name string, err error, want []string) {
		t.Helper()
		if !errors.Is(err, idemq.ErrInvalidConfig) {
			t.Errorf("%s = %v, want idemq.ErrInvalidConfig", name, err)
		}
		var ce *idemq.ConfigError
		if !errors.As(err, &ce) {
			t.Errorf("%s = %v, want a *idemq.ConfigError", name, err)
		}
		if got := cfgerr.Fields(err); !slices.Equal(got, want) {
			t.Errorf("%s = %v, reports fields %q, want %q", name, err, got, want)
		}
	}
	_, err := outbox.NewRelay(nil, nil, outbox.Config{BatchSize: -1, InitialBackoff: 2, MaxBackoff: 1})
	check("NewRelay", err, []string{"outbox.NewRelay(pool)", "outbox.NewRelay(pub)", "outbox.Config.BatchSize", "outbox.Config.MaxBackoff"})
	_, err = outbox.NewSQLiteRelay(&sql.DB{}, nil, outbox.Config{Concurrency: 2, MaxAttempts: -1})
	check("NewSQLiteRelay", err, []string{"outbox.NewSQLiteRelay(pub)", "outbox.Config.Concurrency", "outbox.Config.MaxAttempts"})
	_, err = kafkaoutbox.New(kafkaoutbox.Config{})
	check("kafkaoutbox.New", err, []string{"kafkaoutbox.Config.Brokers"})
	_, err = amqpoutbox.New(amqpoutbox.Config{})
	check("amqpoutbox.New", err, []string{"amqpoutbox.Config.URL"})
	_, err = sqsoutbox.New(nil)
	check("sqsoutbox.New", err, []string{"sqsoutbox.New(c)"})
}
