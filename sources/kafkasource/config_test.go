package kafkasource_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/cfgerr"
	"github.com/idemq/idemq/sources/kafkasource"
)

// TestConfigErrorsNameEveryField: New reports every bad field at once, each a
// *idemq.ConfigError matching
// idemq.ErrInvalidConfig. It needs no broker.
func TestConfigErrorsNameEveryField(t *testing.T) {
	cases := []struct {
		name string
		cfg  kafkasource.Config
		want []string
	}{
		{"brokers and group", kafkasource.Config{Topics: []string{"t"}},
			[]string{"kafkasource.Config.Brokers", "kafkasource.Config.GroupID"}},
		{"topics and in-flight", kafkasource.Config{Brokers: []string{"127.0.0.1:1"}, Topics: []string{"a", "a"}, GroupID: "g", MaxInFlight: -1, CommitTimeout: -1},
			[]string{"kafkasource.Config.Topics", "kafkasource.Config.MaxInFlight", "kafkasource.Config.CommitTimeout"}},
		{"bounds compared", kafkasource.Config{Brokers: []string{"127.0.0.1:1"}, Topics: []string{"t"}, GroupID: "g",
			MaxInFlight: 10, MaxUncommitted: 5, MinBytes: 10, MaxBytes: 5, SessionTimeout: 5, HeartbeatInterval: 5},
			[]string{"kafkasource.Config.MaxUncommitted", "kafkasource.Config.MaxBytes", "kafkasource.Config.HeartbeatInterval"}},
		{"bounds negative", kafkasource.Config{Brokers: []string{"127.0.0.1:1"}, Topics: []string{"t"}, GroupID: "g",
			MinBytes: -1, HeartbeatInterval: -1},
			[]string{"kafkasource.Config.MinBytes", "kafkasource.Config.HeartbeatInterval"}},
	}
	for _, tc := range cases {
		src, err := kafkasource.New(t.Context(), tc.cfg)
		if err == nil {
			_ = src.Close()
		}
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

// TestDeadLetterMetadataNames: the dead-letter headers are the names defined
// once in consumer.
func TestDeadLetterMetadataNames(t *testing.T) {
	for got, want := range map[string]string{
		consumer.MetaReason:         consumer.MetaReason,
		consumer.MetaAttempts:       consumer.MetaAttempts,
		consumer.MetaKey:            consumer.MetaKey,
		consumer.MetaDeadLetteredAt: consumer.MetaDeadLetteredAt,
	} {
		if got != want {
			t.Errorf("header %q, want %q", got, want)
		}
	}
}
