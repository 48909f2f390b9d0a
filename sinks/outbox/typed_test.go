package outbox_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Publish, PublishSQL and migrate.NewPgx take small interfaces: a wrong type is a
// compile error, not a run-time ErrUnsupportedTx.
func TestWrongTxDoesNotCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command; skipped with -short")
	}
	out, err := exec.Command("go", "build", "-o", os.DevNull, "./testdata/wrongtx").CombinedOutput()
	if err == nil {
		t.Fatalf("testdata/wrongtx compiled; want type errors:\n%s", out)
	}
	for _, want := range []string{
		"*sql.Tx does not implement outbox.PgxQuerier",
		"type *sql.DB of db does not match migrate.PgxBeginner",
		"struct{} does not implement outbox.SQLQuerier",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("go build ./testdata/wrongtx: no %q in:\n%s", want, out)
		}
	}
}
