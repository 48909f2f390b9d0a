package consumer

import (
	"context"
	"testing"
)

// IdempotencyKey must be injective: the consumer's name may contain ':', and
// two different (name, key) pairs must never share a downstream key.
func TestIdempotencyKeyIsInjective(t *testing.T) {
	pairs := [][2]string{
		{"orders:eu", "1"}, {"orders", "eu:1"},
		{"a%3Ab", "c"}, {"a:b", "c"}, {"a", "b%3Ac"},
		{"x%", "y"}, {"x", "%y"}, {"", ":"}, {":", ""},
	}
	seen := map[string][2]string{}
	for _, p := range pairs {
		got, ok := IdempotencyKey(withKeys(context.Background(), &msgKeys{scope: p[0], key: p[1]}))
		if !ok {
			t.Fatalf("IdempotencyKey(%q, %q) not set", p[0], p[1])
		}
		if prev, dup := seen[got]; dup {
			t.Errorf("name %q key %q and name %q key %q both give %q", prev[0], prev[1], p[0], p[1], got)
		}
		seen[got] = p
	}
	// Names without '%' or ':' keep the plain "<name>:<key>" form.
	if got, _ := IdempotencyKey(withKeys(context.Background(), &msgKeys{scope: "billing-v2", key: "order:7"})); got != "billing-v2:order:7" {
		t.Errorf("IdempotencyKey = %q, want billing-v2:order:7", got)
	}
}
