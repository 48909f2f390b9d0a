package kafkasource_test

import (
	"testing"
	"time"

	"github.com/idemq/idemq/sources/kafkasource"
)

// The group session defaults are the measured choice (go run
// ./cmd/internal/bench/kafkasession): a killed member's partitions stall about
// 10.5 s instead of 32 s, with no false rebalance under CPU load.
func TestSessionDefaults(t *testing.T) {
	c := kafkasource.Config{}.WithDefaults()
	if c.SessionTimeout != 10*time.Second || c.HeartbeatInterval != time.Second {
		t.Fatalf("SessionTimeout %s, HeartbeatInterval %s; want 10s and 1s", c.SessionTimeout, c.HeartbeatInterval)
	}
}

// The rejoin backoff is short: after a broker restart, the group's join
// waits for the coordinator to load the group and then for kafka-go's next
// attempt, one JoinGroupBackoff at most (docs/chaos.md measures both).
func TestJoinGroupBackoffDefault(t *testing.T) {
	if c := (kafkasource.Config{}).WithDefaults(); c.JoinGroupBackoff != 200*time.Millisecond {
		t.Fatalf("JoinGroupBackoff %s, want 200ms", c.JoinGroupBackoff)
	}
}
