package pgdedup

import "time"

// Retention returns how long a record is kept (Config.Retention after
// defaults): a redelivery later than this runs the handler again. The
// consumer.Runner compares it with its source's redelivery horizon.
func (s *Store) Retention() time.Duration { return s.cfg.Retention }
