package sqsdlq

import (
	"errors"
	"testing"
)

// moveDestination sends a whole dead-letter queue only to the one queue
// that can have fed it, and refuses every queue that could feed it letters
// of another origin.
func TestMoveDestination(t *testing.T) {
	const a, b = "arn:aws:sqs:eu-west-1:123:orders", "arn:aws:sqs:eu-west-1:123:refunds"
	only := func(arns ...string) string {
		p := `{"redrivePermission":"byQueue","sourceQueueArns":[`
		for i, arn := range arns {
			if i > 0 {
				p += ","
			}
			p += `"` + arn + `"`
		}
		return p + `]}`
	}
	for _, c := range []struct {
		name      string
		policy    string
		sources   []string
		requested string
		want      string // "" when refused
	}{
		{"no policy: any queue may feed it", "", []string{a}, "", ""},
		{"allowAll", `{"redrivePermission":"allowAll"}`, []string{a}, a, ""},
		{"denyAll", `{"redrivePermission":"denyAll"}`, nil, "", ""},
		{"two allowed sources", only(a, b), []string{a}, a, ""},
		{"malformed policy", `{"redrivePermission":`, []string{a}, a, ""},
		{"one allowed source", only(a), []string{a}, "", a},
		{"one allowed source, requested", only(a), []string{a}, a, a},
		{"one allowed source, no redrive policy names it yet", only(a), nil, "", a},
		{"another queue requested", only(a), []string{a}, b, ""},
		{"another queue still names it in its redrive policy", only(a), []string{a, b}, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := moveDestination(c.policy, c.sources, c.requested)
			switch {
			case c.want == "" && (err == nil || !errors.Is(err, ErrNativeUnsafe) || !errors.Is(err, ErrNativeUnsupported)):
				t.Errorf("moveDestination = %q, %v; want ErrNativeUnsafe (an ErrNativeUnsupported)", got, err)
			case c.want != "" && (err != nil || got != c.want):
				t.Errorf("moveDestination = %q, %v; want %q", got, err, c.want)
			}
		})
	}
}
