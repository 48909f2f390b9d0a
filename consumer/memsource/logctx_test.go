package memsource_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/internal/testenv"
)

// TestLogsCarryTheCallersContext checks that the broker's log lines (an
// injected fault, an expired delivery) are made with the context of the
// call that caused them, so that a trace-aware handler can tie them to it.
func TestLogsCarryTheCallersContext(t *testing.T) {
	rec := testenv.NewLogRecorder()
	b := memsource.New(memsource.Config{VisibilityTimeout: 20 * time.Millisecond, Logger: rec.Logger()})
	b.Inject(memsource.Fault{Kind: memsource.Redelivered, Key: "a"})
	publish(b, "t", "a")
	src := b.Source("t")
	ctx, cancel := context.WithTimeout(testenv.MarkedContext(t.Context(), "receive"), 5*time.Second)
	defer cancel()
	if _, err := src.Receive(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Receive(ctx, 10); err != nil { // after the visibility timeout
		t.Fatal(err)
	}
	for _, prefix := range []string{"memsource: injected fault", "memsource: visibility timeout passed"} {
		lines := rec.Find(prefix)
		if len(lines) == 0 {
			t.Fatalf("no %q line logged", prefix)
		}
		for _, l := range lines {
			if l.Mark != "receive" {
				t.Errorf("%q logged with a context without the Receive call's values", l.Message)
			}
		}
	}
}
