package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemq/idemq/dedup"
)

// prober is a Path that can check that its store answers, without touching
// any message's record.
type prober interface {
	probe(ctx context.Context, scope string) error
}

// probe begins a transaction and rolls it back.
func (p *txPath[Tx]) probe(ctx context.Context, _ string) error {
	tx, err := p.store.Begin(ctx)
	if err != nil {
		return fmt.Errorf("idemq: probe: begin: %w", err)
	}
	if err := p.store.Rollback(ctx, tx); err != nil {
		return fmt.Errorf("idemq: probe: rollback: %w", err)
	}
	return nil
}

// probeKey is the key the lease path's probe inspects; no message has it
// (the scope is the runner's, and a key never starts with a NUL: validKey).
const probeKey = "\x00idemq-probe"

// probe inspects a key that no message has.
func (p *leasePath) probe(ctx context.Context, scope string) error {
	if _, err := p.store.Inspect(ctx, scope, probeKey); err != nil && !errors.Is(err, dedup.ErrNotFound) {
		return fmt.Errorf("idemq: probe: %w", err)
	}
	return nil
}
