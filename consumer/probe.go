package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/idemq/idemq/dedup"
)

// probe begins a transaction and rolls it back.
func (p *txPath[Tx]) probe(ctx context.Context, _ string) error {
	tx, err := p.drv.Begin(ctx)
	if err != nil {
		return fmt.Errorf("idemq: probe: begin: %w", err)
	}
	if err := p.drv.Rollback(ctx, tx); err != nil {
		return fmt.Errorf("idemq: probe: rollback: %w", err)
	}
	return nil
}

// probeKey is the key the lease path's probe inspects; no message has it
// (the scope is the runner's, and a key never starts with a NUL: validKey).
const probeKey = "\x00idemq-probe"

// probe inspects a key that no message has.
func (p *leasePath) probe(ctx context.Context, scope string) error {
	if _, err := p.drv.Inspect(ctx, scope, probeKey); err != nil && !errors.Is(err, dedup.ErrNotFound) {
		return fmt.Errorf("idemq: probe: %w", err)
	}
	return nil
}

// checkSchema asks the store of path (when its driver checks schemas) and
// every hook of cfg that implements
// dedup.SchemaChecker whether its tables exist, and returns an error
// wrapping the first *dedup.SchemaError. Any other error (the database is
// down) is logged and left to the outage handling: Run starts, and its
// first messages find out.
func checkSchema(ctx context.Context, path Path, cfg Config, log *slog.Logger) error {
	var checkers []dedup.SchemaChecker
	if path.driverCaps().SchemaCheck {
		checkers = append(checkers, path.driver())
	}
	for _, h := range cfg.Hooks {
		if c, ok := h.(dedup.SchemaChecker); ok {
			checkers = append(checkers, c)
		}
	}
	for _, c := range checkers {
		cctx, cancel := context.WithTimeout(ctx, probeTimeout)
		err := c.CheckSchema(cctx)
		cancel()
		switch {
		case errors.Is(err, dedup.ErrNotMigrated):
			return fmt.Errorf("idemq: consumer %q cannot start: %w", cfg.Name, err)
		case err != nil && ctx.Err() == nil:
			log.LogAttrs(ctx, slog.LevelWarn, "could not check the database schema; starting unchecked",
				slog.Any(LogKeyError, err))
		}
	}
	return nil
}

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
