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
