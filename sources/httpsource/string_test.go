package httpsource_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/idemq/idemq/sources/httpsource"
)

// String names the source for the Runner's start line.
func TestSourceString(t *testing.T) {
	src, err := httpsource.New(httpsource.Config{UnsafeSharedKeySpace: true})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	s, ok := any(src).(fmt.Stringer)
	if !ok || !strings.HasPrefix(s.String(), "http") {
		t.Fatalf("*httpsource.Source: String %v; want one that names http", ok)
	}
}
