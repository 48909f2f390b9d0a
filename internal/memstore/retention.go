package memstore

import (
	"time"

	"github.com/idemq/idemq/dedup"
)

var _ dedup.RetentionReporter = (*Store)(nil)

// Retention returns Config.Retention after defaults.
func (s *Store) Retention() time.Duration { return s.cfg.Retention }
