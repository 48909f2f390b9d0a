package console

import "testing"

// Reasons that differ only in the values of one error fall in one group;
// different errors do not.
func TestNormalizeReason(t *testing.T) {
	for _, c := range []struct{ a, b string }{
		{`bad SKU 17`, `bad SKU 4`},
		{`order "A-1" not found`, `order 'B-22' not found`},
		{`payment 3f2b8c1e-9a7d-4e1f-8b2a-0c9d8e7f6a5b refused`, `payment 11111111-2222-4333-8444-555555555555 refused`},
		{`tx deadbeef42 aborted`, `tx 0x1234abcd99 aborted`},
		{"timeout after 1.5s\n  at x", "timeout after 30s at x"},
	} {
		if na, nb := normalizeReason(c.a), normalizeReason(c.b); na != nb {
			t.Errorf("%q -> %q and %q -> %q: want one group", c.a, na, c.b, nb)
		}
	}
	for _, c := range []struct{ a, b string }{
		{"bad SKU 17", "card declined"},
		{"cafe closed", "face closed"}, // short hex-looking words are words
	} {
		if na, nb := normalizeReason(c.a), normalizeReason(c.b); na == nb {
			t.Errorf("%q and %q both -> %q: want two groups", c.a, c.b, na)
		}
	}
	if got := normalizeReason(""); got != "(no reason)" {
		t.Errorf("empty reason -> %q", got)
	}
}
