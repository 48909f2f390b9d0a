// Package apicheck_test tests .ci/apicheck, the compatibility gate, on a
// small module of its own: a git repository whose first commit is the
// baseline, and whose working tree then loses exported identifiers.
package apicheck_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The module's files at the baseline: a root package, a sub-package with a
// method, and identifiers that are not API (an internal package, a
// command's and the documentation's).
var baselineFiles = map[string]string{
	"go.mod": "module example.com/gate\n\ngo 1.22\n",
	"gate.go": `// Package gate is the root package.
package gate

// Keep stays.
func Keep() {}

// Gone is removed.
func Gone() {}

// Config loses Old.
type Config struct {
	Name string
	Old  int
}
`,
	"sub/sub.go": `// Package sub has a method.
package sub

// T loses M.
type T struct{}

// M is removed.
func (*T) M() {}
`,
	"internal/in/in.go":  "// Package in is internal.\npackage in\n\n// X is removed.\nfunc X() {}\n",
	"cmd/tool/main.go":   "package main\n\n// Exported is removed.\nfunc Exported() {}\n\nfunc main() {}\n",
	"docs/snippets/s.go": "// Package snippets is documentation.\npackage snippets\n\n// S is removed.\nfunc S() {}\n",
	"CHANGELOG.md":       "# Changelog\n\n## [Unreleased]\n",
	".ci/api-baseline":   "# set below\n",
}

// The working tree after the breaks: Gone, Config.Old and T.M removed, and
// the identifiers that are not API removed too.
var brokenFiles = map[string]string{
	"gate.go": `// Package gate is the root package.
package gate

// Keep stays.
func Keep() {}

// Config lost Old.
type Config struct {
	Name string
}
`,
	"sub/sub.go":         "// Package sub has a method.\npackage sub\n\n// T lost M.\ntype T struct{}\n",
	"internal/in/in.go":  "// Package in is internal.\npackage in\n",
	"cmd/tool/main.go":   "package main\n\nfunc main() {}\n",
	"docs/snippets/s.go": "// Package snippets is documentation.\npackage snippets\n",
}

func TestAPICheck(t *testing.T) {
	if testing.Short() {
		t.Skip("builds apidiff (the module proxy the first time) and compiles two trees")
	}
	for _, tool := range []string{"git", "bash", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found", tool)
		}
	}
	script, err := os.ReadFile(filepath.Join("..", "..", ".ci", "apicheck"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write(t, dir, baselineFiles)
	write(t, dir, map[string]string{".ci/apicheck": string(script)})
	git(t, dir, "init", "-q")
	git(t, dir, "add", "-A")
	git(t, dir, "commit", "-q", "-m", "baseline")
	git(t, dir, "tag", "v0.1.0")
	base := strings.TrimSpace(git(t, dir, "rev-parse", "HEAD"))
	setBaseline := func(b string) {
		write(t, dir, map[string]string{".ci/api-baseline": "# The baseline.\n" + b + "\n"})
	}
	setChangelog := func(s string) {
		write(t, dir, map[string]string{"CHANGELOG.md": "# Changelog\n\n<!-- `gate.Gone` in a comment above the sections does not count. -->\n\n" + s})
	}
	setBaseline(base)

	t.Run("unchanged API passes", func(t *testing.T) {
		out := run(t, dir, 0)
		mustContain(t, out, "no incompatible API change since the baseline")
	})

	write(t, dir, brokenFiles)
	named := []string{"`gate.Gone`", "`gate.Config.Old`", "`sub.T.M`"}
	notAPI := []string{"in.X", "Exported", "snippets.S"}

	t.Run("unnamed breaks fail and are named", func(t *testing.T) {
		out := run(t, dir, 1)
		for _, s := range append(named, "Config.Old: removed", "sub.(*T).M: removed", "does not name") {
			mustContain(t, out, s)
		}
		for _, s := range notAPI {
			mustNotContain(t, out, s)
		}
	})

	t.Run("a near name does not count", func(t *testing.T) {
		setChangelog("## [Unreleased]\n\n### Added\n\n- `sub.T.M` under Added says nothing of its removal.\n\n" +
			"### Removed\n\n- `gate.Gone()` and `gate.Config.Old`: gone.\n" +
			"- `sub.T.MM`, `xsub.T.M`, `sub.T.M.N` are other names.\n\n```\nsub.T.M\n```\n")
		out := run(t, dir, 1)
		mustContain(t, out, "`sub.T.M`")
		mustNotContain(t, out, "`gate.Gone`")
		mustNotContain(t, out, "`gate.Config.Old`")
	})

	t.Run("named breaks pass", func(t *testing.T) {
		setChangelog("## [Unreleased]\n\n### Removed\n\n- `gate.Gone()` and `gate.Config.Old`: gone.\n\n" +
			"### Changed\n\n- The method `sub.T.M` is gone too.\n")
		out := run(t, dir, 0)
		mustContain(t, out, "3 incompatible API changes since the baseline")
	})

	t.Run("a release tag as baseline counts the sections above its own", func(t *testing.T) {
		setBaseline("v0.1.0")
		names := "- `gate.Gone`, `gate.Config.Old` and `sub.T.M` are gone.\n"
		setChangelog("## [Unreleased]\n\n## [0.1.0] - 2026-01-01\n\n" + names)
		out := run(t, dir, 1)
		mustContain(t, out, "since the baseline v0.1.0")
		for _, s := range named {
			mustContain(t, out, s)
		}
		setChangelog("## [Unreleased]\n\n## [0.2.0] - 2026-02-01\n\n" + names + "\n## [0.1.0] - 2026-01-01\n")
		run(t, dir, 0)
	})

	t.Run("a release and its commit, for a clone without tags", func(t *testing.T) {
		setBaseline("v0.1.0 " + base)
		setChangelog("## [Unreleased]\n\n## [0.1.0] - 2026-01-01\n\n- `gate.Gone`, `gate.Config.Old` and `sub.T.M` are gone.\n")
		out := run(t, dir, 1)
		mustContain(t, out, "since the baseline v0.1.0")
		setChangelog("## [Unreleased]\n\n- `gate.Gone`, `gate.Config.Old` and `sub.T.M` are gone.\n\n## [0.1.0] - 2026-01-01\n")
		run(t, dir, 0)
	})

	t.Run("a baseline missing from the clone fails clearly", func(t *testing.T) {
		setBaseline(strings.Repeat("1", 40))
		out := run(t, dir, 1)
		mustContain(t, out, "is not in this clone")
	})
}

// run runs the gate in dir and returns its output, failing the test unless
// it exits with want.
func run(t *testing.T, dir string, want int) string {
	t.Helper()
	cmd := exec.Command("bash", filepath.Join(dir, ".ci", "apicheck"))
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	got := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatal(err)
		}
		got = ee.ExitCode()
	}
	if got != want {
		t.Fatalf("apicheck exited %d, want %d:\n%s", got, want, out.String())
	}
	return out.String()
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	args = append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false"}, args...)
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func write(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func mustContain(t *testing.T, out, s string) {
	t.Helper()
	if !strings.Contains(out, s) {
		t.Errorf("output lacks %q:\n%s", s, out)
	}
}

func mustNotContain(t *testing.T, out, s string) {
	t.Helper()
	if strings.Contains(out, s) {
		t.Errorf("output has %q:\n%s", s, out)
	}
}
