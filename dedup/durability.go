package dedup

import (
	"context"
	"errors"
)

// DurabilityReporter is an optional interface of a store whose server can be
// set up to acknowledge a write before the write is safe from a restart or a
// crash (Redis without an fsync'ed append-only file; redisdedup implements
// it). A record lost that way is a processed key forgotten: its next
// delivery runs the handler again.
//
// The Runner asks once, when Run starts (bounded by a few seconds):
//
//   - Durability.Loss empty: nothing to say.
//   - Durability.Loss set: Run logs one WARN with the loss and the settings
//     read, reports the loss in Health.StoreLoss (consumer), and runs.
//   - an error matching ErrNotDurable: the store was told to refuse such a
//     server (redisdedup.Config.RequireDurable); Run returns the error before
//     receiving anything.
//   - another error: Run logs one WARN and runs unchecked.
type DurabilityReporter interface {
	// Durability reads the server's persistence settings and says whether a
	// write the server acknowledged can be lost.
	Durability(ctx context.Context) (Durability, error)
}

// Durability is what a store read of its server's persistence settings.
type Durability struct {
	// Settings are the settings read, as the server names them, for logs
	// and errors: "appendonly=yes appendfsync=everysec".
	Settings string
	// Loss says how a write the server acknowledged can be lost (by a
	// restart of the server, a crash of it or of its machine), or could be,
	// when a setting that matters could not be read; empty when the
	// settings read rule that out.
	Loss string
}

// ErrNotDurable is matched by the error of a DurabilityReporter set to refuse
// a server that can lose the writes it acknowledged (see
// redisdedup.Config.RequireDurable). The error is a *idemq.ConfigError
// that states the settings read.
var ErrNotDurable = errors.New("dedup: the store's server can lose acknowledged writes")
