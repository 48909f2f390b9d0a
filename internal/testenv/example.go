package testenv

import (
	"bytes"
	"io"
	"os"
	"testing"
)

// ExampleOutput runs example, an Example function that needs a service and
// therefore carries no "// Output:" line (go test -short ./... would run
// it), and returns what it printed to os.Stdout, for the test that checks
// it. Resolve the service first (DatabaseURL and the like), so that the test
// skips under -short. A panic in example fails t.
func ExampleOutput(t testing.TB, example func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatalf("testenv: pipe for the example's output: %v", err)
	}
	read := make(chan []byte, 1)
	go func() {
		var b bytes.Buffer
		_, _ = io.Copy(&b, r)
		_ = r.Close()
		read <- b.Bytes()
	}()
	stdout := os.Stdout
	os.Stdout = w
	panicked, value := func() (panicked bool, value any) {
		defer func() {
			if v := recover(); v != nil {
				panicked, value = true, v
			}
		}()
		example()
		return false, nil
	}()
	os.Stdout = stdout
	_ = w.Close()
	out := string(<-read)
	if panicked {
		t.Fatalf("testenv: the example panicked: %v\nit printed:\n%s", value, out)
	}
	return out
}
