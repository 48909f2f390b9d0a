package consumer

import (
	"fmt"

	"github.com/idemq/idemq"
)

// fitPool checks cfg.Concurrency against the connection pool of path's store.
// Each lane holds a connection for its whole transaction, and the handler's
// own queries outside the transaction, the retention janitor and the rest of
// the process need at least one more, so the pool must be larger than
// Concurrency. An unset Concurrency (explicit is false) is lowered to fit
// instead of failing.
func fitPool(path Path, cfg *Config, explicit bool) error {
	size := path.poolSize()
	if size <= 0 || cfg.Concurrency < size {
		return nil
	}
	if !explicit && size >= 2 {
		cfg.Concurrency = size - 1
		return nil
	}
	return &idemq.ConfigError{Field: "Concurrency", Reason: fmt.Sprintf(
		"%d lanes need a connection pool of at least %d connections (one per lane, each held for its whole transaction, "+
			"plus at least one for the handler's queries outside its transaction and the retention janitor); "+
			"the store's pool has %d: raise the pool size (pgxpool: pool_max_conns or Config.MaxConns; "+
			"database/sql: SetMaxOpenConns) or lower Concurrency", cfg.Concurrency, cfg.Concurrency+1, size)}
}
