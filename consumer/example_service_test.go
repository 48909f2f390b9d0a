package consumer_test

import (
	"testing"

	"github.com/idemq/idemq/internal/testenv"
)

// TestServiceExamples runs the examples that need PostgreSQL and checks what
// they print. They carry no "// Output:" line, so that go test -short runs
// no example that needs a service.
func TestServiceExamples(t *testing.T) {
	t.Setenv("TEST_DATABASE_URL", testenv.DatabaseURL(t))
	for _, tc := range []struct {
		name    string
		example func()
		want    string
	}{
		{"ExampleTransactional", ExampleTransactional, "balances: 500 700\nhandled 2, duplicates 2\n"},
		{"ExampleTransactionalBatch", ExampleTransactionalBatch, "balances: 500 500\nhandled 10, duplicates 1, dead-lettered 1\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := testenv.ExampleOutput(t, tc.example); got != tc.want {
				t.Errorf("%s printed\n%s\nwant\n%s", tc.name, got, tc.want)
			}
		})
	}
}
