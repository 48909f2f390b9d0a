package memsource_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/cfgerr"
	"github.com/idemq/idemq/sources/memsource"
)

// TestConfigErrorsNameEveryField: Validate reports a *consumer.ConfigError
// per bad field (Config has one field that can be wrong) that matches
// consumer.ErrInvalidConfig as well as the package's own ErrInvalidConfig.
func TestConfigErrorsNameEveryField(t *testing.T) {
	err := memsource.Config{VisibilityTimeout: -1}.Validate()
	if !errors.Is(err, consumer.ErrInvalidConfig) || !errors.Is(err, memsource.ErrInvalidConfig) {
		t.Errorf("Validate = %v, want consumer.ErrInvalidConfig and memsource.ErrInvalidConfig", err)
	}
	if got, want := cfgerr.Fields(err), []string{"memsource.Config.VisibilityTimeout"}; !slices.Equal(got, want) {
		t.Errorf("Validate = %v, reports fields %q, want %q", err, got, want)
	}
}
