package consumer

import (
	"context"
	"errors"
	"log/slog"

	"github.com/idemq/idemq/dedup"
)

// Log attribute keys of the durability check.
const (
	// LogKeyStoreLoss says how the store's server can lose the records it
	// acknowledged (dedup.Durability.Loss).
	LogKeyStoreLoss = "store_loss"
	// LogKeyStoreSettings are the persistence settings the store read
	// (dedup.Durability.Settings).
	LogKeyStoreSettings = "store_settings"
)

// storeDurability asks the store of path, once when Run starts, whether its
// server can lose the records it acknowledged (see
// dedupdriver.Caps.Durability), and returns the loss, which Run keeps for
// Health.StoreLoss. It logs one WARN when it can, or when the settings could
// not be read; it returns the store's refusal (an error matching
// dedup.ErrNotDurable).
func storeDurability(ctx context.Context, path Path, log *slog.Logger) (string, error) {
	if !path.driverCaps().Durability {
		return "", nil
	}
	dctx, cancel := context.WithTimeout(ctx, probeTimeout)
	d, err := path.driver().Durability(dctx)
	cancel()
	switch {
	case errors.Is(err, dedup.ErrNotDurable):
		return "", err
	case err != nil:
		log.LogAttrs(ctx, slog.LevelWarn, "could not read the dedup store's persistence settings; whether it can lose the records it acknowledged is not known",
			slog.Any(LogKeyError, err))
		return "", nil
	case d.Loss != "":
		log.LogAttrs(ctx, slog.LevelWarn, "the dedup store can lose records it acknowledged: a processed key it loses runs the handler again when its message is delivered again",
			slog.String(LogKeyStoreLoss, d.Loss), slog.String(LogKeyStoreSettings, d.Settings))
	}
	return d.Loss, nil
}
