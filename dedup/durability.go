package dedup

import "errors"

// Durability is what a store read of its server's persistence settings:
// the answer of its driver's Durability (dedupdriver.Caps.Durability).
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

// ErrNotDurable is matched by the error of a store's Durability (see
// dedupdriver.Caps.Durability) set to refuse
// a server that can lose the writes it acknowledged (see
// redisdedup.Config.RequireDurable). The error is a *idemq.ConfigError
// that states the settings read.
var ErrNotDurable = errors.New("dedup: the store's server can lose acknowledged writes")
