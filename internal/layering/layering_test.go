package layering_test

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/idemq/idemq"

// pkg is the part of `go list -json` the rules read.
type pkg struct {
	ImportPath string
	Imports    []string // of the non-test files
	Deps       []string // transitive, non-test
}

// list returns every package of the module (test-only packages included).
func list(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Imports,Deps", module+"/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages; run from the module", len(pkgs))
	}
	return pkgs
}

func under(path, prefix string) bool {
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// The core imports no broker SDK, no OpenTelemetry and no adapter: a user
// who writes a worker with consumer and a store pays for nothing else.
func TestCoreImportsNoAdapter(t *testing.T) {
	forbidden := []string{
		"github.com/segmentio/kafka-go", "github.com/aws/aws-sdk-go-v2", "github.com/rabbitmq/amqp091-go",
		"go.opentelemetry.io", "github.com/twmb/franz-go",
		module + "/sources", module + "/sinks", module + "/examples", module + "/cmd", module + "/internal/testenv",
	}
	core := map[string][]string{ // package -> extra forbidden prefixes
		module + "/consumer":         {"github.com/redis/go-redis", module + "/dedup/pgdedup", module + "/dedup/sqldedup", module + "/dedup/redisdedup"},
		module + "/dedup":            {"github.com/redis/go-redis", "github.com/jackc/pgx"},
		module + "/dedup/pgdedup":    {"github.com/redis/go-redis"},
		module + "/dedup/sqldedup":   {"github.com/redis/go-redis", "github.com/jackc/pgx"},
		module + "/dedup/redisdedup": {"github.com/jackc/pgx"},
	}
	seen := 0
	for _, p := range list(t) {
		extra, ok := core[p.ImportPath]
		if !ok {
			continue
		}
		seen++
		for _, d := range p.Deps {
			for _, f := range append(forbidden, extra...) {
				if under(d, f) {
					t.Errorf("%s depends on %s", p.ImportPath, d)
				}
			}
		}
	}
	if seen != len(core) {
		t.Fatalf("found %d of the %d core packages", seen, len(core))
	}
}

// internal/testenv (which starts services and containers) is for tests: only
// test files, and test-helper packages (named …test), import it.
func TestTestEnvOnlyInTests(t *testing.T) {
	for _, p := range list(t) {
		last := p.ImportPath[strings.LastIndex(p.ImportPath, "/")+1:]
		if under(p.ImportPath, module+"/internal/testenv") || strings.HasSuffix(last, "test") {
			continue
		}
		for _, imp := range p.Imports {
			if under(imp, module+"/internal/testenv") {
				t.Errorf("%s imports %s outside its tests", p.ImportPath, imp)
			}
		}
	}
}

// Examples and commands are leaves: programs to run or copy, which no
// package imports.
func TestExamplesAndCommandsAreLeaves(t *testing.T) {
	for _, p := range list(t) {
		for _, leaf := range []string{module + "/examples", module + "/cmd"} {
			if under(p.ImportPath, leaf) {
				continue
			}
			for _, imp := range p.Imports {
				if under(imp, leaf) {
					t.Errorf("%s imports %s", p.ImportPath, imp)
				}
			}
		}
	}
}

// The operations command links no demo machinery: not the demo's package,
// not its in-process Kafka (franz-go's kfake). The demo is cmd/idemq-demo.
// (sqldedup's SQLite driver stays: idemq takes sqlite: DSNs.)
func TestOperationsCommandLinksNoDemo(t *testing.T) {
	forbidden := []string{module + "/cmd/internal/demo", module + "/cmd/internal/checkout", module + "/sources/memsource", "github.com/twmb/franz-go"}
	seen := false
	for _, p := range list(t) {
		if p.ImportPath != module+"/cmd/idemq" {
			continue
		}
		seen = true
		for _, d := range p.Deps {
			for _, f := range forbidden {
				if under(d, f) {
					t.Errorf("cmd/idemq depends on %s", d)
				}
			}
		}
	}
	if !seen {
		t.Fatal("go list did not find cmd/idemq")
	}
}

// The floors: the root package idemq (the types every layer shares) imports
// nothing of the module; internal/ is the bottom floor and imports nothing
// of the module but itself and the root package; dedup stands on them, and
// consumer (with its test kit) on dedup: neither imports a source, a sink or
// a program. Only non-test imports count.
func TestFloors(t *testing.T) {
	for _, p := range list(t) {
		var allowed func(imp string) bool
		switch {
		case p.ImportPath == module:
			allowed = func(string) bool { return false }
		case under(p.ImportPath, module+"/internal"):
			allowed = func(imp string) bool { return imp == module || under(imp, module+"/internal") }
		case under(p.ImportPath, module+"/dedup"):
			allowed = func(imp string) bool {
				return imp == module || under(imp, module+"/internal") || under(imp, module+"/dedup")
			}
		case under(p.ImportPath, module+"/consumer"):
			allowed = func(imp string) bool {
				return imp == module || under(imp, module+"/internal") || under(imp, module+"/consumer") || under(imp, module+"/dedup")
			}
		default:
			continue
		}
		for _, imp := range p.Imports {
			if under(imp, module) && !allowed(imp) {
				t.Errorf("%s imports %s: an import that runs back up a floor", p.ImportPath, imp)
			}
		}
	}
}
