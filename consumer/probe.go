package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime"
	"strings"

	"github.com/idemq/idemq/dedup"
)

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

func (p *leasePath) probe(ctx context.Context, scope string) error {
	if _, err := p.drv.Inspect(ctx, scope, probeKey); err != nil && !errors.Is(err, dedup.ErrNotFound) {
		return fmt.Errorf("idemq: probe: %w", err)
	}
	return nil
}

// checkSchema asks the store of path (when its driver checks schemas) and
// every hook of cfg that implements dedup.SchemaChecker whether its tables
// exist (see Run). Any other error (the database is down) is logged and
// left to the outage handling.
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

// storeDurability asks the store of path whether its server can lose the
// records it acknowledged (see dedupdriver.Caps.Durability) and returns the
// loss, for Health.StoreLoss, or the store's refusal. It logs one WARN when
// it can, or when the settings could not be read.
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

func (p *txPath[Tx]) describe() (string, string) {
	if p.bh != nil {
		return "transactional-batch", typeName(p.store)
	}
	return "transactional", typeName(p.store)
}

func (p *leasePath) describe() (string, string) { return "lease", typeName(p.store) }

// logStart logs at Info what a runner with cfg consumes (the source's
// String, else its type), through which path and store, and with which key
// function. log names the consumer already.
func logStart(ctx context.Context, log *slog.Logger, cfg Config, source Source, path Path) {
	kind, store := path.describe()
	src := typeName(source)
	if s, ok := source.(fmt.Stringer); ok {
		src = s.String()
	}
	log.LogAttrs(ctx, slog.LevelInfo, "consuming",
		slog.String("source", src),
		slog.String("path", kind),
		slog.String("store", store),
		slog.String("key", funcName(cfg.KeyFunc)),
		slog.Int("concurrency", cfg.Concurrency),
		slog.Int("batch_size", cfg.BatchSize))
}

// typeName is v's dynamic type, like "*pgdedup.Store".
func typeName(v any) string {
	if v == nil {
		return "<nil>"
	}
	return reflect.TypeOf(v).String()
}

// funcName is the name of a function value without its module path, like
// "consumer.DefaultKey"; closures are named after their enclosing function.
func funcName(f any) string {
	v := reflect.ValueOf(f)
	if v.Kind() != reflect.Func || v.IsNil() {
		return "<nil>"
	}
	fn := runtime.FuncForPC(v.Pointer())
	if fn == nil {
		return "<unknown>"
	}
	name := fn.Name()
	return name[strings.LastIndex(name, "/")+1:]
}
