package memdedup

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/faults"
)

// Errors returned by the store. Match them with errors.Is.
var (
	// ErrTxDone is returned when a committed or rolled-back Tx is used.
	ErrTxDone = errors.New("memdedup: transaction already committed or rolled back")
	// ErrForeignTx is returned when a Tx is passed to a Store that did not
	// begin it.
	ErrForeignTx = errors.New("memdedup: transaction belongs to another store")
	// ErrNoSavepoint is returned by RollbackToSavepoint without a savepoint.
	ErrNoSavepoint = errors.New("memdedup: no savepoint to roll back to")
	// ErrNotClaimed is returned by Unclaim for a key the transaction does
	// not hold.
	ErrNotClaimed = errors.New("memdedup: key not claimed by this transaction")
	// ErrDuplicateKey is returned by Claim when a key appears twice in one
	// call or was already claimed by the same transaction.
	ErrDuplicateKey = errors.New("memdedup: key claimed twice in one transaction")
	// ErrInjected is the default error of an injected fault.
	ErrInjected = errors.New("memdedup: injected fault")
)

// Config configures a Store. The zero value is usable.
type Config struct {
	// Now is the store's clock, used for processed-at times, retention and
	// leases. Tests move time forward by returning later instants. It must
	// be safe for concurrent use. Defaults to time.Now.
	Now func() time.Time
	// Retention is how long a committed record (or a completed lease) is
	// remembered; an older record counts as absent. Defaults to
	// dedup.DefaultRetention.
	Retention time.Duration
	// OnEvent, if set, is called with every Event, after the operation took
	// effect and before it returns, outside the store's lock. It may be
	// called from several goroutines at once. Defaults to nil.
	OnEvent func(Event)
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Retention == 0 {
		c.Retention = dedup.DefaultRetention
	}
	return c
}

// Store is an in-memory store of the transactional path
// (dedupdriver.TxStore[*Tx]); Leases gives its lease-path view. It is safe for concurrent use.
type Store struct {
	cfg Config

	mu      sync.Mutex
	records map[key]*record
	leases  map[key]*lease
	values  map[string]int64
	open    map[*Tx]struct{}
	nextTx  uint64
	seq     uint64
	events  []Event
	faults  faults.Script[Fault]
	fails   map[key]failureCount
}

// New returns an empty Store. It fails if cfg.Retention is negative.
func New(cfg Config) (*Store, error) {
	cfg = cfg.WithDefaults()
	if cfg.Retention < 0 {
		return nil, fmt.Errorf("memdedup: Config.Retention must not be negative, got %s", cfg.Retention)
	}
	return &Store{
		cfg:     cfg,
		records: make(map[key]*record),
		leases:  make(map[key]*lease),
		values:  make(map[string]int64),
		open:    make(map[*Tx]struct{}),
	}, nil
}

// key identifies a record: a deduplication key within a scope.
type key struct{ scope, key string }

// record is a claimed (owner != nil) or committed (owner == nil) key.
type record struct {
	hash        dedup.Hash
	processedAt time.Time
	expiresAt   time.Time
	owner       *Tx
	result      []byte // see StoreResults
	// released is closed when the owner commits, rolls back or unclaims.
	released chan struct{}
}

// Tx is a transaction of a Store. Its claims and effects become visible to
// other transactions at Commit. A Tx must be used by one goroutine at a time.
type Tx struct {
	s     *Store
	id    uint64
	done  bool
	ops   []op
	marks []int // savepoints: indexes into ops
}

// ID returns the transaction's number, as reported in Event.Tx.
func (tx *Tx) ID() uint64 { return tx.id }

type opKind int

const (
	opClaim opKind = iota + 1
	opAdd
)

// op is one change made in a transaction.
type op struct {
	kind  opKind
	dead  bool // undone by Unclaim
	k     key
	rec   *record
	name  string
	delta int64
}

// Begin starts a transaction. It fails only through an injected fault.
func (s *Store) Begin(ctx context.Context) (*Tx, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if f := s.takeFault(BeginError); f != nil {
		s.mu.Unlock()
		return nil, f.err()
	}
	s.nextTx++
	tx := &Tx{s: s, id: s.nextTx}
	s.open[tx] = struct{}{}
	ev := s.event(EventBegin, tx.id, nil, nil)
	s.mu.Unlock()
	s.emit(ev)
	return tx, nil
}

// Commit makes the transaction's claims and effects visible at once and ends
// it. An injected fault makes it fail; with Fault.Applied the commit happens
// although an error is returned (an unknown outcome).
func (s *Store) Commit(ctx context.Context, tx *Tx) error {
	s.mu.Lock()
	if err := s.usable(tx); err != nil {
		s.mu.Unlock()
		return err
	}
	if f := s.takeFault(CommitError); f != nil {
		err := f.err()
		var ev Event
		if f.Applied {
			keys := s.apply(tx)
			ev = s.event(EventCommit, tx.id, keys, err)
		} else {
			s.undo(tx, 0)
			ev = s.event(EventCommitFailed, tx.id, nil, err)
		}
		s.end(tx)
		s.mu.Unlock()
		s.emit(ev)
		return fmt.Errorf("memdedup: commit: %w", err)
	}
	keys := s.apply(tx)
	s.end(tx)
	ev := s.event(EventCommit, tx.id, keys, nil)
	s.mu.Unlock()
	s.emit(ev)
	return nil
}

// Rollback undoes the transaction and ends it. It is a no-op on a
// transaction that already ended, so it is safe to defer after Commit.
func (s *Store) Rollback(ctx context.Context, tx *Tx) error {
	s.mu.Lock()
	if tx == nil || tx.s != s {
		s.mu.Unlock()
		return ErrForeignTx
	}
	if tx.done {
		s.mu.Unlock()
		return nil
	}
	s.undo(tx, 0)
	s.end(tx)
	ev := s.event(EventRollback, tx.id, nil, nil)
	s.mu.Unlock()
	s.emit(ev)
	return nil
}

// Savepoint opens a savepoint; with releasePrevious the savepoint opened by
// the previous call is released first.
func (s *Store) Savepoint(ctx context.Context, tx *Tx, releasePrevious bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(tx); err != nil {
		return err
	}
	if releasePrevious {
		if len(tx.marks) == 0 {
			return fmt.Errorf("memdedup: release of savepoint: %w", ErrNoSavepoint)
		}
		tx.marks = tx.marks[:len(tx.marks)-1]
	}
	tx.marks = append(tx.marks, len(tx.ops))
	return nil
}

// RollbackToSavepoint undoes the claims and effects made since the last
// Savepoint call; the savepoint stays open.
func (s *Store) RollbackToSavepoint(ctx context.Context, tx *Tx) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(tx); err != nil {
		return err
	}
	if len(tx.marks) == 0 {
		return ErrNoSavepoint
	}
	s.undo(tx, tx.marks[len(tx.marks)-1])
	return nil
}

// Claim claims recs in tx under scope and reports, in the order of recs,
// whether each key is new, done or a payload mismatch. Keys are taken in
// ascending order. A key claimed by another open transaction makes Claim wait
// until that transaction ends or ctx is done; in the latter case Claim returns
// ctx.Err() wrapped, and the keys it took stay claimed by tx until tx ends.
func (s *Store) Claim(ctx context.Context, tx *Tx, scope string, recs []dedup.Record) ([]dedup.Claim, error) {
	order := make([]int, len(recs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(recs[a].Key, recs[b].Key) })
	for i := 1; i < len(order); i++ {
		if recs[order[i]].Key == recs[order[i-1]].Key {
			return nil, fmt.Errorf("memdedup: claim of key %q: %w", recs[order[i]].Key, ErrDuplicateKey)
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(tx); err != nil {
		return nil, err
	}
	if f := s.takeFault(ClaimError); f != nil {
		return nil, fmt.Errorf("memdedup: claim: %w", f.err())
	}
	claims := make([]dedup.Claim, len(recs))
	for _, i := range order {
		c, err := s.claimOne(ctx, tx, key{scope, recs[i].Key}, recs[i].PayloadHash)
		if err != nil {
			return nil, err
		}
		claims[i] = c
	}
	return claims, nil
}

// claimOne claims k for tx, waiting for another owner to finish. s.mu is held
// on entry and on return, and released while waiting.
func (s *Store) claimOne(ctx context.Context, tx *Tx, k key, hash dedup.Hash) (dedup.Claim, error) {
	for {
		if tx.done {
			return dedup.Claim{}, ErrTxDone
		}
		r := s.records[k]
		switch {
		case r == nil || (r.owner == nil && !s.cfg.Now().Before(r.expiresAt)):
			r = &record{hash: hash, owner: tx, released: make(chan struct{})}
			s.records[k] = r
			tx.ops = append(tx.ops, op{kind: opClaim, k: k, rec: r})
			return dedup.Claim{Key: k.key, State: dedup.StateNew}, nil
		case r.owner == tx:
			return dedup.Claim{}, fmt.Errorf("memdedup: claim of key %q: %w", k.key, ErrDuplicateKey)
		case r.owner != nil:
			released, owner := r.released, r.owner.id
			s.mu.Unlock()
			select {
			case <-released:
				s.mu.Lock()
			case <-ctx.Done():
				s.mu.Lock()
				return dedup.Claim{}, fmt.Errorf("memdedup: waiting for key %q held by transaction %d: %w", k.key, owner, ctx.Err())
			}
		default:
			state := dedup.StateDone
			if r.hash != hash {
				state = dedup.StateMismatch
			}
			c := dedup.Claim{Key: k.key, State: state, StoredHash: r.hash, ProcessedAt: r.processedAt}
			if state == dedup.StateDone {
				c.Result = r.result
			}
			return c, nil
		}
	}
}

// Unclaim removes the claim of key made by Claim in tx and wakes any
// transaction waiting for it.
func (s *Store) Unclaim(ctx context.Context, tx *Tx, scope, k string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(tx); err != nil {
		return err
	}
	for i := len(tx.ops) - 1; i >= 0; i-- {
		o := &tx.ops[i]
		if o.kind == opClaim && !o.dead && o.k == (key{scope, k}) {
			s.release(o)
			return nil
		}
	}
	return fmt.Errorf("memdedup: unclaim of key %q in scope %q: %w", k, scope, ErrNotClaimed)
}

// Add adds delta to the named value when tx commits. Tests use it as the
// handler's business mutation and read the result with Store.Value.
func (tx *Tx) Add(name string, delta int64) error {
	s := tx.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(tx); err != nil {
		return err
	}
	tx.ops = append(tx.ops, op{kind: opAdd, name: name, delta: delta})
	return nil
}

// Value returns the named value as tx sees it: the committed value plus tx's
// own pending additions.
func (tx *Tx) Value(name string) int64 {
	s := tx.s
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.values[name]
	for _, o := range tx.ops {
		if o.kind == opAdd && !o.dead && o.name == name {
			v += o.delta
		}
	}
	return v
}

// Value returns the committed value of name (0 if nothing was ever added).
func (s *Store) Value(name string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.values[name]
}

// Values returns a copy of every committed value.
func (s *Store) Values() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[string]int64, len(s.values))
	for k, v := range s.values {
		m[k] = v
	}
	return m
}

// OpenTxs returns the number of transactions begun and not yet ended. Tests
// use it to check that nothing leaks a transaction.
func (s *Store) OpenTxs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.open)
}

// Record returns the committed record of key in scope, or dedup.ErrNotFound
// if there is none or it expired. Uncommitted claims are not visible.
func (s *Store) Record(scope, k string) (dedup.Entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.records[key{scope, k}]
	if r == nil || r.owner != nil || !s.cfg.Now().Before(r.expiresAt) {
		return dedup.Entry{}, fmt.Errorf("memdedup: key %q in scope %q: %w", k, scope, dedup.ErrNotFound)
	}
	return dedup.Entry{Scope: scope, Key: k, PayloadHash: r.hash, ProcessedAt: r.processedAt, ExpiresAt: r.expiresAt, Result: r.result}, nil
}

// Sweep deletes the committed records and completed leases whose retention
// has passed, as the real stores' janitors do, and returns how many it
// deleted. Expired records already count as absent without it.
func (s *Store) Sweep() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	n := 0
	for k, r := range s.records {
		if r.owner == nil && !now.Before(r.expiresAt) {
			delete(s.records, k)
			n++
		}
	}
	for k, l := range s.leases {
		if !now.Before(l.until) {
			delete(s.leases, k)
			n++
		}
	}
	return n
}

// usable checks that tx belongs to s and is open. s.mu is held.
func (s *Store) usable(tx *Tx) error {
	switch {
	case tx == nil || tx.s != s:
		return ErrForeignTx
	case tx.done:
		return ErrTxDone
	}
	return nil
}

// apply makes tx's live ops visible and returns the keys it recorded. s.mu is
// held.
func (s *Store) apply(tx *Tx) []Key {
	now := s.cfg.Now()
	var keys []Key
	for i := range tx.ops {
		o := &tx.ops[i]
		if o.dead {
			continue
		}
		switch o.kind {
		case opClaim:
			o.rec.owner = nil
			o.rec.processedAt = now
			o.rec.expiresAt = now.Add(s.cfg.Retention)
			close(o.rec.released)
			keys = append(keys, Key{Scope: o.k.scope, Key: o.k.key})
		case opAdd:
			s.values[o.name] += o.delta
		}
	}
	return keys
}

// undo undoes tx's live ops from index from on and drops them. s.mu is held.
func (s *Store) undo(tx *Tx, from int) {
	for i := len(tx.ops) - 1; i >= from; i-- {
		if o := &tx.ops[i]; !o.dead && o.kind == opClaim {
			s.release(o)
		}
	}
	tx.ops = tx.ops[:from]
}

// release drops the claim of o and wakes its waiters. s.mu is held.
func (s *Store) release(o *op) {
	o.dead = true
	if s.records[o.k] == o.rec {
		delete(s.records, o.k)
	}
	close(o.rec.released)
}

// end marks tx done. s.mu is held.
func (s *Store) end(tx *Tx) {
	tx.done = true
	tx.ops, tx.marks = nil, nil
	delete(s.open, tx)
}
