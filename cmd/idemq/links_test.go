package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The operations command links no demo machinery: not the demo's packages,
// not the in-memory broker, not the demo's in-process Kafka (franz-go's
// kfake); the demo is cmd/idemq-demo. (sqldedup's SQLite driver stays: idemq
// takes sqlite: DSNs.) The layering itself is depguard's (.golangci.yml);
// this is about what one binary links, which only its transitive
// dependencies show.
func TestLinksNoDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	const module = "github.com/idemq/idemq"
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 20 {
		t.Fatalf("go list -deps listed %d packages: %q", len(deps), deps)
	}
	forbidden := []string{module + "/cmd/idemq-demo/internal/demo", module + "/cmd/idemq-demo/internal/checkout", module + "/consumer/memsource", "github.com/twmb/franz-go"}
	for _, d := range deps {
		for _, f := range forbidden {
			if d == f || strings.HasPrefix(d, f+"/") {
				t.Errorf("cmd/idemq depends on %s", d)
			}
		}
	}
}
