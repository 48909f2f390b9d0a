package sqldedup

import "database/sql"

// PoolSize returns the MaxOpenConnections of the *sql.DB behind a Postgres
// store (0, the database/sql default, means no limit), or 0 for any other
// DB. consumer.NewRunner uses it to refuse a Concurrency the pool cannot
// serve (see dedupdriver.Caps.Pool).
//
// A SQLite store reports 0: OpenSQLite limits its pool to one connection on
// purpose (SQLite has one writer), and the runner's batches queue for it. A
// handler on SQLite must therefore do all its database work through the
// transaction it is given; a query on the *sql.DB would wait for ever.
func (s txDriver) PoolSize() int {
	if s.cfg.Dialect != Postgres {
		return 0
	}
	if db, ok := s.db.(interface{ Stats() sql.DBStats }); ok {
		return db.Stats().MaxOpenConnections
	}
	return 0
}
