package memdedup

import "fmt"

// Op names an operation a Fault can fail.
type Op int

// Operations that can fail.
const (
	// OpBegin fails Begin.
	OpBegin Op = iota + 1
	// OpClaim fails Claim before it claims anything.
	OpClaim
	// OpCommit fails Commit: the transaction is rolled back, or, with
	// Fault.Applied, committed although Commit returns the error.
	OpCommit
	// OpRecordFailure fails RecordFailure (the failure is not counted).
	OpRecordFailure
)

// String returns the operation's name.
func (o Op) String() string {
	switch o {
	case OpBegin:
		return "begin"
	case OpClaim:
		return "claim"
	case OpCommit:
		return "commit"
	case OpRecordFailure:
		return "record failure"
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// Fault scripts failures of an operation.
type Fault struct {
	// Op is the operation that fails.
	Op Op
	// Err is the error returned (wrapped). Defaults to ErrInjected.
	Err error
	// Times is how many calls of Op fail. Zero means 1; negative means
	// every call until ClearFaults.
	Times int
	// Applied, for OpCommit, makes the commit happen although Commit returns
	// the error: the outcome a client sees when the connection drops after
	// the server committed. The caller must then not acknowledge, and the
	// redelivery must be recognised as a duplicate.
	Applied bool
}

func (f Fault) err() error {
	if f.Err != nil {
		return f.Err
	}
	return ErrInjected
}

// Inject schedules f. Faults for the same Op are used in the order they were
// injected. Safe for concurrent use.
func (s *Store) Inject(f Fault) {
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

// takeFault returns the first fault scheduled for op and uses up one of its
// calls, or returns nil. s.mu is held.
func (s *Store) takeFault(op Op) *Fault {
	f, ok := s.faults.Fire(func(f Fault) bool { return f.Op == op })
	if !ok {
		return nil
	}
	return &f
}
