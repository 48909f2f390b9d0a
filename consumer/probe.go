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
