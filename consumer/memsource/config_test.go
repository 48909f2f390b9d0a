package memsource_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/internal/cfgerr"
)

// TestConfigErrorsNameEveryField: Validate reports a *idemq.ConfigError
// per bad field (Config has one field that can be wrong) that matches
// idemq.ErrInvalidConfig.
func TestConfigErrorsNameEveryField(t *testing.T) {
	err := memsource.Config{VisibilityTimeout: -1}.Validate()
	if !errors.Is(err, idemq.ErrInvalidConfig) {
		t.Errorf("Validate = %v, want idemq.ErrInvalidConfig", err)
	}
	if got, want := cfgerr.Fields(err), []string{"memsource.Config.VisibilityTimeout"}; !slices.Equal(got, want) {
		t.Errorf("Validate = %v, reports fields %q, want %q", err, got, want)
	}
}
