package deduptest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
)

const (
	// subtestTimeout bounds every subtest, including its waits for expiry.
	subtestTimeout = 60 * time.Second
	// pollInterval is how often the suite looks again while waiting for a
	// lease or a record to expire.
	pollInterval = 25 * time.Millisecond
	// expiryGrace is how much longer than a lease or retention the suite
	// waits for the store to forget it.
	expiryGrace = 10 * time.Second
)

// testContext returns a context bounded by subtestTimeout and cancelled when
// t ends.
func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), subtestTimeout)
	t.Cleanup(cancel)
	return ctx
}

// newScope returns a scope no other test uses: the test's name plus a random
// suffix, within the 200 bytes a consumer name may have.
func newScope(t *testing.T) string {
	t.Helper()
	name := strings.NewReplacer("/", ".", " ", "_").Replace(t.Name())
	if len(name) > 150 {
		name = name[len(name)-150:]
	}
	return "deduptest." + name + "." + randomHex(6)
}

// newToken returns a fresh lease token.
func newToken() string { return randomHex(16) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// payload returns a distinct payload digest for each label.
func payload(label string) dedup.Hash { return dedup.HashPayload([]byte("deduptest payload " + label)) }

// rec is shorthand for a dedup.Record.
func rec(key string, h dedup.Hash) dedup.Record { return dedup.Record{Key: key, PayloadHash: h} }

// eventually calls cond every pollInterval until it returns true or timeout
// passes, and reports whether it did.
func eventually(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		select {
		case <-ctx.Done():
		case <-time.After(pollInterval):
		}
	}
}
