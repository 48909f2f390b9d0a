package consumertest_test

import (
	"testing"

	"github.com/idemq/idemq/internal/testenv"
)

// TestServiceExamples runs the examples that need PostgreSQL and checks what
// they print. They carry no "// Output:" line, so that go test -short runs
// no example that needs a service.
func TestServiceExamples(t *testing.T) {
	t.Setenv("TEST_DATABASE_URL", testenv.DatabaseURL(t))
	const want = "ledger rows: 5, total charged: 1500\nhandler calls for order-5: 3, effects: 1\n"
	if got := testenv.ExampleOutput(t, ExampleReplayTx); got != want {
		t.Errorf("ExampleReplayTx printed\n%s\nwant\n%s", got, want)
	}
}
