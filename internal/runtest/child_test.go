package runtest_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/runtest"
)

// TestHelperPrinter is the child of TestChildExpect: it prints three lines
// and exits. It does nothing when run on its own.
func TestHelperPrinter(t *testing.T) {
	if os.Getenv("IDEMQ_RUNTEST_PRINTER") != "1" {
		t.Skip("helper process of TestChildExpect")
	}
	fmt.Println("a 1")
	fmt.Fprintln(os.Stderr, "b 2")
	fmt.Println("a 3")
}

// Expect reads on after the line it last returned, on stdout and stderr,
// and finds the lines a child printed before it exited.
func TestChildExpect(t *testing.T) {
	c := runtest.StartChild(t, "TestHelperPrinter", []string{"IDEMQ_RUNTEST_PRINTER=1"})
	<-c.Done()
	for _, want := range []string{"a 1", "b 2", "a 3"} {
		if got := c.Expect(t, want[:1], 10*time.Second); got != want {
			t.Fatalf("Expect(%q) = %q, want %q", want[:1], got, want)
		}
	}
	if err := c.Err(); err != nil || c.Killed() {
		t.Fatalf("child exited with %v (killed %v), want 0", err, c.Killed())
	}
}
