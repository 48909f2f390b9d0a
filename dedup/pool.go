package dedup

// PoolSizer is an optional interface of a TxStore whose transactions take
// connections from a pool of limited size. PoolSize returns the most
// connections the pool opens, or 0 when there is no limit (or the store
// cannot tell).
//
// The runner holds one connection per concurrent batch (Config.Concurrency)
// for the whole transaction, so a pool no larger than Concurrency leaves none
// for a handler's own queries outside its transaction, for the retention
// janitor or for anything else in the process: they wait for ever while the
// batches wait for them. consumer.NewRunner refuses such a configuration.
type PoolSizer interface {
	PoolSize() int
}
