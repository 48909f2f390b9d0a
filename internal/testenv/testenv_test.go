package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func TestReadEnvFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "env")
	content := "# comment\n\nexport A='postgres://x@h:1/db?sslmode=disable'\nB=\"two\"\nexport C=plain\nbroken line\n"
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := readEnvFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"A": "postgres://x@h:1/db?sslmode=disable", "B": "two", "C": "plain"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("readEnvFile = %v; want %v", got, want)
	}
}

func TestHostPort(t *testing.T) {
	for in, want := range map[string]string{
		DefaultDatabaseURL:           "127.0.0.1:5432",
		"postgres://u@db/x":          "db:5432",
		DefaultRedisURL:              "127.0.0.1:6379",
		DefaultAMQPURL:               "127.0.0.1:5672",
		"amqp://guest:guest@rabbit/": "rabbit:5672",
		DefaultSQSEndpoint:           "127.0.0.1:9324",
	} {
		if got, err := urlHostPort(in); err != nil || got != want {
			t.Errorf("urlHostPort(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if got, err := firstBroker(" a:1, b:2 "); err != nil || got != "a:1" {
		t.Errorf("firstBroker = %q, %v", got, err)
	}
	if _, err := urlHostPort("no-scheme"); err == nil {
		t.Error("urlHostPort accepted a value without host")
	}
}

func TestSchemaName(t *testing.T) {
	seen := map[string]bool{}
	for _, name := range []string{
		"TestX", "TestX/sub-case#01", strings.Repeat("VeryLongName", 20), "Ünïcode/テスト",
	} {
		s := schemaName(name)
		if len(s) > 63 || !strings.HasPrefix(s, "t_") || seen[s] {
			t.Errorf("schemaName(%q) = %q", name, s)
		}
		seen[s] = true
		for _, r := range s {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
				t.Errorf("schemaName(%q) = %q has %q", name, s, r)
			}
		}
	}
	if s := schemaName("TestX/sub-case#01"); !strings.HasPrefix(s, "t_testx_sub_case_01_") {
		t.Errorf("schemaName = %q", s)
	}
}

func TestWithSearchPath(t *testing.T) {
	got, err := WithSearchPath(DefaultDatabaseURL, "t_x_1")
	if err != nil {
		t.Fatal(err)
	}
	if want := "postgres://postgres@127.0.0.1:5432/idemq_test?search_path=t_x_1&sslmode=disable"; got != want {
		t.Fatalf("WithSearchPath = %q; want %q", got, want)
	}
}

// fatalTB records Fatalf instead of failing the real test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (f *fatalTB) Skipf(format string, args ...any) {
	f.msg = "SKIP " + fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// shortMode makes resolve see -short as on (true) or off for one test.
func shortMode(t *testing.T, on bool) {
	old := short
	short = func() bool { return on }
	t.Cleanup(func() { short = old })
}

// TestShortSkips: under -short every getter skips its test, even when the
// environment variable names an address.
func TestShortSkips(t *testing.T) {
	shortMode(t, true)
	t.Setenv(EnvDatabaseURL, "postgres://127.0.0.1:1/x")
	if got, msg := resolveCapturing(t, Postgres); got != "" || !strings.HasPrefix(msg, "SKIP ") || !strings.Contains(msg, Postgres) {
		t.Errorf("resolve under -short = %q, %q; want a skip naming %s", got, msg, Postgres)
	}
}

func resolveCapturing(t *testing.T, name string) (value, fatal string) {
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		value = resolve(f, name)
	}()
	<-done
	return value, f.msg
}

// withService installs a fake service whose default address nothing serves.
func withService(t *testing.T, svc service) {
	services[svc.name] = svc
	t.Cleanup(func() {
		delete(services, svc.name)
		resolved.Delete(svc.name)
	})
}

func TestResolveOrder(t *testing.T) {
	shortMode(t, false)
	dir := t.TempDir()
	t.Setenv(EnvServicesDir, dir)
	const envVar = "TESTENV_FAKE_URL"
	t.Setenv(envVar, "")
	// Port 1 on loopback: nothing listens there.
	withService(t, service{"fake", envVar, "redis://127.0.0.1:1/0", urlHostPort})

	_, fatal := resolveCapturing(t, "fake")
	t.Log(fatal)
	for _, want := range []string{"make services", envVar, "does not exist", "127.0.0.1:1"} {
		if !strings.Contains(fatal, want) {
			t.Errorf("fatal message %q lacks %q", fatal, want)
		}
	}

	// An env file entry that does not answer is passed over as well.
	if err := os.WriteFile(filepath.Join(dir, "env"), []byte("export "+envVar+"='redis://127.0.0.1:1/1'\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, fatal := resolveCapturing(t, "fake"); !strings.Contains(fatal, "does not answer") {
		t.Errorf("fatal message %q does not say the env file's address does not answer", fatal)
	}

	// The environment variable wins without any check.
	t.Setenv(envVar, "redis://elsewhere:6379/0")
	if got, fatal := resolveCapturing(t, "fake"); got != "redis://elsewhere:6379/0" || fatal != "" {
		t.Errorf("resolve = %q (fatal %q); want the environment variable", got, fatal)
	}
}

func TestScriptPath(t *testing.T) {
	p, err := ScriptPath()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(p, filepath.Join("testdata", "services", "services.sh")) {
		t.Fatalf("ScriptPath = %q", p)
	}
}

func TestExampleOutput(t *testing.T) {
	stdout := os.Stdout
	if got := ExampleOutput(t, func() { fmt.Println("one"); fmt.Print("two") }); got != "one\ntwo" {
		t.Errorf("ExampleOutput = %q, want %q", got, "one\ntwo")
	}
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ExampleOutput(f, func() { fmt.Println("before"); panic("no database") })
	}()
	<-done
	if !strings.Contains(f.msg, "no database") || !strings.Contains(f.msg, "before") {
		t.Errorf("a panicking example failed the test with %q, want the panic and the output", f.msg)
	}
	if os.Stdout != stdout {
		t.Fatal("os.Stdout not restored")
	}
}
