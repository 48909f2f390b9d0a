package main

import (
	"bytes"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/testenv"
)

// The demo starts its workers as "<this program> worker ...": the test
// binary answers that itself.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == workerArg {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func demoRun(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestDemo runs the demo shortened, with this test binary as the worker
// program, and checks that it prints the summary and the proof.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo (in-process Kafka, SQLite, worker processes)")
	}
	start := time.Now()
	code, out, errOut := demoRun(t, "--messages", "300", "--kills", "2", "--seed", "11")
	t.Logf("idemq-demo took %s:\n%s%s", time.Since(start).Round(time.Millisecond), out, errOut)
	if code != exitOK {
		t.Fatalf("idemq-demo = %d, want 0", code)
	}
	for _, want := range []string{"KILL -9 worker #1", "Summary", "messages sent", "duplicates absorbed", "worker restarts", "PROOF HOLDS"} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--broker", "pulsar"}, exitUsage, "pulsar"},
		{[]string{"--no-such-flag"}, exitUsage, "flag provided but not defined"},
		{[]string{"extra", "--messages", "1"}, exitUsage, `unexpected arguments ["extra" "--messages" "1"]`},
		{[]string{"-h"}, exitOK, "-messages"},
	} {
		code, out, errOut := demoRun(t, tc.args...)
		if code != tc.code || !strings.Contains(out+errOut, tc.want) {
			t.Errorf("idemq-demo %q = %d, want %d and %q; output:\n%s%s", tc.args, code, tc.code, tc.want, out, errOut)
		}
	}
}

// plantedSecret is put in the password and secret query parameters of the
// PostgreSQL URLs below; no output may show it.
const plantedSecret = "Pl4ntedS3cret"

// TestNoSecretInOutput runs the help and failing runs with a secret planted
// in the PostgreSQL URLs of the environment and of --db.
func TestNoSecretInOutput(t *testing.T) {
	pg, err := url.Parse(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	// A real server, a database that does not exist: the server's error
	// quotes the database name.
	wrongDB := *pg
	wrongDB.User = url.UserPassword(pg.User.Username(), plantedSecret)
	wrongDB.Path = "/idemq_no_such_db"
	wrongDB.RawQuery = "sslmode=disable&sslpassword=" + plantedSecret
	closed := "postgres://idemq:" + plantedSecret + "@127.0.0.1:1/orders?sslpassword=" + plantedSecret
	keyValue := "host=127.0.0.1 port=1 user=idemq password='" + plantedSecret + "' dbname=orders sslpassword=" + plantedSecret
	for _, name := range databaseURLEnv {
		t.Setenv(name, closed)
	}
	for i, args := range [][]string{
		{"-h"},
		{"--store", "postgres", "--broker", "memory", "--messages", "1", "--kills", "-1"},
		{"--store", "postgres", "--db", wrongDB.String(), "--broker", "memory", "--messages", "1", "--kills", "-1"},
		{"--store", "postgres", "--db=" + keyValue, "--broker", "memory", "--messages", "1", "--kills", "-1"},
	} {
		code, out, errOut := demoRun(t, args...)
		all := out + errOut
		if strings.Contains(all, plantedSecret) {
			t.Errorf("run %d (exit %d) shows the secret:\n%s", i, code, all)
		}
		if args[0] != "-h" && code == exitOK {
			t.Errorf("run %d succeeded; the test wants its failure output:\n%s", i, all)
		}
	}
}
