// Package faults is the vocabulary of injected failures that the in-memory
// kits share (Kind: consumertest's scripted deliveries, memsource's broker,
// memdedup's store), and the script that fires them (Script): faults fire in
// the order they were injected, each a given number of times. What else a
// fault carries, and which operation it matches, stays with its owner. The
// kits re-export Kind (FaultKind) and the kinds they accept, so that their
// users never import this package.
package faults

// Script holds the scheduled faults of type F. The zero value is an empty
// script. It is not safe for concurrent use: its owner guards it with the
// mutex that guards the state the faults act on.
type Script[F any] struct {
	active []*scheduled[F]
}

// scheduled is an injected fault with the firings it has left.
type scheduled[F any] struct {
	fault     F
	remaining int // < 0: unlimited
}

// Add schedules f to fire times times: zero means once, negative means until
// Clear.
func (s *Script[F]) Add(f F, times int) {
	if times == 0 {
		times = 1
	}
	s.active = append(s.active, &scheduled[F]{fault: f, remaining: times})
}

// Clear removes every scheduled fault.
func (s *Script[F]) Clear() { s.active = nil }

// Fire returns the first scheduled fault, in the order of Add, for which
// match reports true, and uses up one of its firings (a fault is removed after
// its last). match is called in that order and stops at the first true, so
// that a match that draws from a seeded RNG draws the same sequence on every
// run. ok is false when no fault matched.
func (s *Script[F]) Fire(match func(F) bool) (f F, ok bool) {
	for i, a := range s.active {
		if !match(a.fault) {
			continue
		}
		if a.remaining > 0 {
			a.remaining--
			if a.remaining == 0 {
				s.active = append(s.active[:i:i], s.active[i+1:]...)
			}
		}
		return a.fault, true
	}
	return f, false
}
