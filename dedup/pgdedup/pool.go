package pgdedup

import "github.com/jackc/pgx/v5/pgxpool"

// PoolSize returns the MaxConns of the *pgxpool.Pool behind the store (4 or
// the number of CPUs, whichever is larger, unless the pool's configuration or
// its pool_max_conns connection-string parameter says otherwise), or 0 for
// any other DB. consumer.NewRunner uses it to refuse a Concurrency the pool
// cannot serve (see dedupdriver.Caps.Pool).
func (s txDriver) PoolSize() int {
	if p, ok := s.db.(*pgxpool.Pool); ok {
		return int(p.Config().MaxConns)
	}
	return 0
}
