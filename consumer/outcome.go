package consumer

// Outcome is how the runner settled a message (see HookSettled).
type Outcome int

// Outcomes.
const (
	// OutcomeHandled: the handler ran, its effect is durable, and the
	// message was acknowledged (or the ack failed; see SettleInfo.Err).
	OutcomeHandled Outcome = iota + 1
	// OutcomeDuplicate: the key was processed before; acknowledged.
	OutcomeDuplicate
	// OutcomeRetried: handed back for a later attempt.
	OutcomeRetried
	// OutcomeDeadLettered: moved to the dead-letter route.
	OutcomeDeadLettered
	// OutcomeLeft: left to the broker, which redelivers it (a failed
	// Retry or DeadLetter, a drain cut short, nothing decided).
	OutcomeLeft
)

// String returns the outcome's name: "handled", "duplicate", "retried",
// "dead_lettered" or "left".
func (o Outcome) String() string {
	return nameOf(o, "handled", "duplicate", "retried", "dead_lettered", "left")
}
