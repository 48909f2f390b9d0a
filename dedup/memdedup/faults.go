package memdedup

import (
	"fmt"
	"slices"

	"github.com/idemq/idemq/internal/faults"
)

// FaultKind names an injected failure (Fault.Kind): which operation of the
// store fails. It is the one vocabulary of injected failures that every
// in-memory kit speaks (consumer/consumertest, consumer/memsource, memdedup):
// an alias, so a kind from one kit is a kind of every other, under the same
// name in each.
type FaultKind = faults.Kind

// The kinds a Store accepts (see Fault.Kind). Each has the same name in every
// in-memory kit that accepts it.
const (
	// BeginError fails Begin.
	BeginError = faults.BeginError
	// ClaimError fails Claim before it claims anything.
	ClaimError = faults.ClaimError
	// CommitError fails Commit.
	CommitError = faults.CommitError
	// RecordFailureError fails RecordFailure (the failure is not counted).
	RecordFailureError = faults.RecordFailureError
)

// kinds are the fault kinds a Store injects (see Fault.Kind).
var kinds = []FaultKind{BeginError, ClaimError, CommitError, RecordFailureError}

// Fault scripts failures of an operation.
type Fault struct {
	// Kind is the operation that fails, one of the kinds this package
	// re-exports: BeginError fails Begin, ClaimError fails Claim before it
	// claims anything, CommitError fails Commit (the transaction is rolled
	// back, or, with Applied, committed although Commit returns the error),
	// and RecordFailureError fails RecordFailure (the failure is not
	// counted). The zero value is no store kind: Inject panics on it.
	Kind FaultKind
	// Err is the error returned (wrapped). Defaults to ErrInjected.
	Err error
	// Times is how many calls of the operation fail. Zero means 1; negative means
	// every call until ClearFaults.
	Times int
	// Applied, for CommitError, makes the commit happen although
	// Commit returns the error: the outcome a client sees when the
	// connection drops after the server committed. The caller must then not acknowledge, and the
	// redelivery must be recognised as a duplicate.
	Applied bool
}

func (f Fault) err() error {
	if f.Err != nil {
		return f.Err
	}
	return ErrInjected
}

// Inject schedules f. Faults of the same Kind are used in the order they
// were injected. It panics if f.Kind is not one of a store's (see
// Fault.Kind). Safe for concurrent use.
func (s *Store) Inject(f Fault) {
	if !slices.Contains(kinds, f.Kind) {
		panic(fmt.Sprintf("memdedup: Inject: fault kind %v is not a store's", f.Kind))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults.Add(f, f.Times)
}

// ClearFaults removes every scheduled fault.
func (s *Store) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults.Clear()
}

// takeFault returns the first fault of kind k scheduled and uses up one of
// its calls, or returns nil. s.mu is held.
func (s *Store) takeFault(k FaultKind) *Fault {
	f, ok := s.faults.Fire(func(f Fault) bool { return f.Kind == k })
	if !ok {
		return nil
	}
	return &f
}
