package memdedup

import "time"

// Retention returns Config.Retention after defaults.
func (s *Store) Retention() time.Duration { return s.cfg.Retention }
