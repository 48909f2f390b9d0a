package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/internal/testenv"
)

func idemq(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestHelpAndUsageErrors(t *testing.T) {
	if code, out, _ := idemq(t, "help"); code != exitOK || !strings.Contains(out, "migrate") || strings.Contains(out, "demo-worker") {
		t.Fatalf("help = %d:\n%s", code, out)
	}
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"migrate"},                       // no DSN
		{"migrate", "--dsn", "mysql://x"}, // unknown database
		{"inspect", "--dsn", "x.db", "k"}, // no scope
		{"inspect", "--dsn", "x.db", "--scope", "s"}, // no key
	} {
		if code, _, errOut := idemq(t, args...); code != exitUsage {
			t.Errorf("idemq %q = %d, want %d (usage); stderr:\n%s", args, code, exitUsage, errOut)
		}
	}
}

func TestMigratePrint(t *testing.T) {
	code, out, errOut := idemq(t, "migrate", "--dsn", "postgres://nowhere.invalid/db", "--schema", "billing", "--print")
	if code != exitOK || !strings.Contains(out, `CREATE TABLE IF NOT EXISTS "billing"."processed_messages"`) {
		t.Fatalf("migrate --print (postgres) = %d:\n%s%s", code, out, errOut)
	}
	code, out, errOut = idemq(t, "migrate", "--dsn", "sqlite:never-created.db", "--table", "seen", "--print")
	if code != exitOK || !strings.Contains(out, `CREATE TABLE IF NOT EXISTS "seen"`) || !strings.Contains(out, "WITHOUT ROWID") {
		t.Fatalf("migrate --print (sqlite) = %d:\n%s%s", code, out, errOut)
	}
	if _, err := os.Stat("never-created.db"); err == nil {
		t.Fatal("migrate --print created the database file")
	}
}

// record marks key as processed in the store behind dsn, as a runner would.
func record(t *testing.T, db *sql.DB, cfg sqldedup.Config, scope, key, body string) {
	t.Helper()
	ctx := context.Background()
	store, err := sqldedup.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := store.MarkProcessedTx(ctx, tx, scope, key, []byte(body)); err != nil {
		t.Fatal(err)
	}
	if err := store.StoreResults(ctx, tx, scope, []dedup.Result{{Key: key, Value: []byte(`{"charge":"ch_1"}`)}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// inspectJSON is the output of `idemq inspect --json`.
type inspectJSON struct {
	Scope            string    `json:"scope"`
	Key              string    `json:"key"`
	State            string    `json:"state"`
	ProcessedAt      time.Time `json:"processed_at"`
	PayloadHash      string    `json:"payload_hash"`
	ExpiresAt        time.Time `json:"expires_at"`
	ExpiresInSeconds float64   `json:"expires_in_seconds"`
	ResultText       string    `json:"result_text"`
}

// migrateInspectPurge runs the record's life through the command line.
func migrateInspectPurge(t *testing.T, dsn string, extra []string, open func() (*sql.DB, sqldedup.Config)) {
	t.Helper()
	if code, out, errOut := idemq(t, append([]string{"migrate", "--dsn", dsn}, extra...)...); code != exitOK || !strings.Contains(out, "up to date") {
		t.Fatalf("migrate = %d:\n%s%s", code, out, errOut)
	}
	if code, _, errOut := idemq(t, append([]string{"migrate", "--dsn", dsn}, extra...)...); code != exitOK {
		t.Fatalf("second migrate = %d:\n%s", code, errOut)
	}
	db, cfg := open()
	record(t, db, cfg, "checkout", "order-42", `{"id":"order-42"}`)
	db.Close()

	code, out, errOut := idemq(t, append(append([]string{"inspect", "--dsn", dsn}, extra...), "--scope", "checkout", "order-42")...)
	hash := "sha256:" + hexSHA256(`{"id":"order-42"}`)
	if code != exitOK || !strings.Contains(out, "key           order-42") || !strings.Contains(out, hash) ||
		!strings.Contains(out, "state         processed") || !strings.Contains(out, "expires at") ||
		!strings.Contains(out, `result        17 bytes "{\"charge\":\"ch_1\"}"`) {
		t.Fatalf("inspect = %d:\n%s%s", code, out, errOut)
	}
	code, out, errOut = idemq(t, append(append([]string{"inspect", "--dsn", dsn, "--json"}, extra...), "--scope", "checkout", "order-42")...)
	var rec inspectJSON
	if code != exitOK {
		t.Fatalf("inspect --json = %d:\n%s%s", code, out, errOut)
	}
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		t.Fatalf("inspect --json output %q: %v", out, err)
	}
	if rec.Scope != "checkout" || rec.Key != "order-42" || rec.State != "processed" || rec.PayloadHash != hash ||
		rec.ProcessedAt.IsZero() || !rec.ExpiresAt.After(rec.ProcessedAt) || rec.ExpiresInSeconds <= 0 ||
		rec.ResultText != `{"charge":"ch_1"}` {
		t.Fatalf("inspect --json = %+v", rec)
	}
	if code, _, errOut := idemq(t, append(append([]string{"inspect", "--dsn", dsn}, extra...), "--scope", "other", "order-42")...); code != exitFailure || !strings.Contains(errOut, "no record") {
		t.Fatalf("inspect in another scope = %d:\n%s", code, errOut)
	}
	if code, out, errOut := idemq(t, append(append([]string{"purge", "--dsn", dsn}, extra...), "--scope", "checkout", "order-42")...); code != exitOK {
		t.Fatalf("purge = %d:\n%s%s", code, out, errOut)
	}
	if code, _, _ := idemq(t, append(append([]string{"inspect", "--dsn", dsn}, extra...), "--scope", "checkout", "order-42")...); code != exitFailure {
		t.Fatalf("inspect after purge = %d, want %d", code, exitFailure)
	}
}

func TestMigrateInspectPurgeSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shop.db")
	migrateInspectPurge(t, "sqlite:"+path, nil, func() (*sql.DB, sqldedup.Config) {
		db, err := sqldedup.OpenSQLite(context.Background(), path)
		if err != nil {
			t.Fatal(err)
		}
		return db, sqldedup.Config{Dialect: sqldedup.SQLite}
	})
}

func TestMigrateInspectPurgePostgres(t *testing.T) {
	url := testenv.DatabaseURL(t)
	schema := testenv.Schema(t, url)
	migrateInspectPurge(t, url, []string{"--schema", schema}, func() (*sql.DB, sqldedup.Config) {
		db, err := sql.Open("pgx", url)
		if err != nil {
			t.Fatal(err)
		}
		return db, sqldedup.Config{Dialect: sqldedup.Postgres, Schema: schema}
	})
}

// TestDemoMoved: the demo is a program of its own (cmd/idemq-demo); `idemq
// demo` says where it went instead of "unknown command".
func TestDemoMoved(t *testing.T) {
	for _, args := range [][]string{{"demo"}, {"demo", "--messages", "1"}, {"demo", "worker"}, {"help", "demo"}} {
		code, out, errOut := idemq(t, args...)
		if all := out + errOut; code != exitUsage || !strings.Contains(all, "make demo") || !strings.Contains(all, "cmd/idemq-demo") {
			t.Errorf("idemq %q = %d, want %d and a pointer to make demo and cmd/idemq-demo; stdout:\n%s\nstderr:\n%s", args, code, exitUsage, out, errOut)
		}
	}
	if code, out, _ := idemq(t, "help"); code != exitOK || strings.Contains(out, "demo") {
		t.Errorf("help = %d, lists demo:\n%s", code, out)
	}
}

func hexSHA256(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// A command's help, asked with `idemq help COMMAND` (on stdout) or
// `idemq COMMAND -h` (on stderr), starts with a usage line that shows its
// positional arguments, then its flags; a usage error repeats the line.
func TestCommandHelpShowsArguments(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		code     int
		toStdout bool
		want     []string
	}{
		{[]string{"help", "inspect"}, exitOK, true, []string{"usage: idemq inspect [flags] SCOPE KEY\n", "-dsn DSN", "-json", "before or after the arguments"}},
		{[]string{"inspect", "-h"}, exitOK, false, []string{"usage: idemq inspect [flags] SCOPE KEY\n", "-scope"}},
		{[]string{"purge", "--help"}, exitOK, false, []string{"usage: idemq purge [flags] SCOPE KEY\n", "-dsn DSN"}},
		{[]string{"help", "migrate"}, exitOK, true, []string{"usage: idemq migrate [flags]\n", "-outbox", "-print"}},
		{[]string{"help", "stats"}, exitOK, true, []string{"usage: idemq stats [flags]\n", "-json"}},
		{[]string{"help", "relay"}, exitOK, true, []string{"usage: idemq relay [flags] [unpark ID...|unpark --all]\n", "-broker", "-dry-run"}},
		{[]string{"help", "version"}, exitOK, true, []string{"usage: idemq version [flags]\n"}},
		{[]string{"inspect", "--dsn", "x.db", "order-1"}, exitUsage, false, []string{"want two arguments, SCOPE and KEY", "usage: idemq inspect [flags] SCOPE KEY\n"}},
		{[]string{"purge", "--dsn", "x.db", "--scope", "s", "a", "b"}, exitUsage, false, []string{"with --scope, want one argument, KEY; got 2", "usage: idemq purge [flags] SCOPE KEY\n"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errOut := idemq(t, tc.args...)
			got, other := errOut, out
			if tc.toStdout {
				got, other = out, errOut
			}
			if code != tc.code || other != "" {
				t.Fatalf("exit %d, want %d; stdout:\n%s\nstderr:\n%s", code, tc.code, out, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("output lacks %q:\n%s", w, got)
				}
			}
		})
	}
}

// idemq version, -version and --version print the module version and the
// Go version.
func TestVersion(t *testing.T) {
	for _, arg := range []string{"version", "-version", "--version"} {
		code, out, errOut := idemq(t, arg)
		if code != exitOK || errOut != "" || !strings.HasPrefix(out, "idemq ") ||
			!strings.Contains(out, runtime.Version()) || !strings.Contains(out, runtime.GOOS+"/"+runtime.GOARCH) {
			t.Errorf("idemq %s = %d:\n%s%s", arg, code, out, errOut)
		}
	}
}

func TestVersionString(t *testing.T) {
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	platform := " " + runtime.GOOS + "/" + runtime.GOARCH
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"release", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/idemq/idemq", Version: "v1.2.3"}},
			"idemq v1.2.3 go1.26.0" + platform},
		{"checkout", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: vcs("0123abcd", "false")},
			"idemq (devel) revision 0123abcd go1.26.0" + platform},
		{"modified checkout", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: vcs("0123abcd", "true")},
			"idemq (devel) revision 0123abcd (modified) go1.26.0" + platform},
		{"no version", &debug.BuildInfo{Main: debug.Module{}},
			"idemq (devel) " + runtime.Version() + platform},
		{"no build info", nil,
			"idemq (unknown version: no build information) " + runtime.Version() + platform},
	} {
		if got := versionString(tc.bi, tc.bi != nil); got != tc.want {
			t.Errorf("%s: versionString = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// idemq migrate lists the migrations it applied (version and name), and
// says "already up to date" when it applied none; the outbox's migrations
// list what they created.
func TestMigrateReportsApplied(t *testing.T) {
	for _, tc := range []struct {
		name     string
		dsn      func(t *testing.T) []string
		outbox   bool
		postgres bool
	}{
		{"sqlite", func(t *testing.T) []string {
			return []string{"--dsn", "sqlite:" + filepath.Join(t.TempDir(), "shop.db")}
		}, false, false},
		{"postgres", func(t *testing.T) []string {
			url := testenv.DatabaseURL(t)
			return []string{"--dsn", url, "--schema", testenv.Schema(t, url)}
		}, false, true},
		{"sqlite outbox", func(t *testing.T) []string {
			return []string{"--dsn", "sqlite:" + filepath.Join(t.TempDir(), "shop.db")}
		}, true, false},
		{"postgres outbox", func(t *testing.T) []string {
			return []string{"--dsn", testenv.SchemaURL(t, testenv.DatabaseURL(t))}
		}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.postgres && testing.Short() {
				t.Skip("needs PostgreSQL; skipped with -short")
			}
			args := append([]string{"migrate"}, tc.dsn(t)...)
			if tc.outbox {
				args = append(args, "--outbox")
			}
			code, out, errOut := idemq(t, args...)
			if code != exitOK {
				t.Fatalf("first migrate = %d:\n%s%s", code, out, errOut)
			}
			var want []string
			if tc.outbox {
				want = []string{"applied the outbox migrations to idemq_outbox", "  table idemq_outbox\n", "  index idemq_outbox_pending_idx\n"}
				if tc.postgres {
					want = append(want, "  trigger idemq_outbox_notify\n", "  function idemq_outbox_notify\n")
				}
			} else {
				d := sqldedup.SQLite
				if tc.postgres {
					d = sqldedup.Postgres
				}
				ms, err := sqldedup.Migrations(d)
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range ms {
					want = append(want, fmt.Sprintf("applied migration %d (%s) to ", m.Version, m.Name))
				}
			}
			for _, w := range append(want, "is up to date\n") {
				if !strings.Contains(out, w) {
					t.Errorf("first migrate's output lacks %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, "already") {
				t.Errorf("first migrate says already up to date:\n%s", out)
			}
			code, out, errOut = idemq(t, args...)
			if code != exitOK || !strings.Contains(out, "is already up to date: no migration applied\n") || strings.Contains(out, "applied migration") {
				t.Fatalf("second migrate = %d:\n%s%s", code, out, errOut)
			}
		})
	}
}

// inspect, purge and stats on a SQLite file that does not exist say so and
// do not create it; on a database without the table they say there is no
// table. Either is a plain error: exit status 1, no stack.
func TestNoDatabaseOrNoTable(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.db")
	empty := filepath.Join(dir, "empty.db")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	type run struct {
		args []string
		want string
	}
	runs := []run{
		{[]string{"inspect", "--dsn", "sqlite:" + missing, "checkout", "order-1"}, "does not exist, so there is no table processed_messages"},
		{[]string{"purge", "--dsn", "sqlite:" + missing, "checkout", "order-1"}, "does not exist, so there is no table processed_messages"},
		{[]string{"stats", "--dsn", "sqlite:" + missing}, "does not exist, so there is no table processed_messages"},
		{[]string{"inspect", "--dsn", "sqlite:" + empty, "checkout", "order-1"}, "there is no table processed_messages in this database"},
		{[]string{"purge", "--dsn", "sqlite:" + empty, "checkout", "order-1"}, "there is no table processed_messages in this database"},
		{[]string{"stats", "--dsn", "sqlite:" + empty, "--table", "seen"}, "there is no table seen in this database"},
		{[]string{"relay", "--dsn", "sqlite:" + missing, "--stats"}, "does not exist, so there is no table idemq_outbox: check --dsn, or create both with idemq migrate --outbox"},
		{[]string{"relay", "--dsn", "sqlite:" + missing, "--broker", "kafka"}, "does not exist, so there is no table idemq_outbox"},
	}
	if !testing.Short() {
		url := testenv.DatabaseURL(t)
		schema := testenv.Schema(t, url)
		runs = append(runs,
			run{[]string{"inspect", "--dsn", url, "--schema", schema, "checkout", "order-1"}, "there is no table " + schema + ".processed_messages in this database"},
			run{[]string{"purge", "--dsn", url, "--schema", schema, "checkout", "order-1"}, "there is no table " + schema + ".processed_messages in this database"},
			run{[]string{"stats", "--dsn", url, "--schema", schema}, "there is no table " + schema + ".processed_messages in this database"},
			run{[]string{"stats", "--dsn", url, "--schema", schema + "_none"}, "there is no table " + schema + "_none.processed_messages in this database"},
		)
	}
	for _, r := range runs {
		name := r.args[0] + " " + filepath.Base(r.args[2])
		if strings.HasPrefix(r.args[2], "postgres") {
			name = r.args[0] + " postgres"
			if strings.HasSuffix(r.args[len(r.args)-1], "_none") {
				name += " no schema"
			}
		}
		t.Run(name, func(t *testing.T) {
			code, out, errOut := idemq(t, r.args...)
			if code != exitFailure || !strings.Contains(errOut, r.want) || strings.Contains(errOut, "goroutine") || strings.Count(errOut, "\n") != 1 {
				t.Errorf("idemq %q = %d, want %d and one line with %q; stdout:\n%s\nstderr:\n%s", r.args, code, exitFailure, r.want, out, errOut)
			}
			if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("%s was created (%v)", missing, err)
			}
		})
	}
}

// Flags may follow positional arguments, in every command; "--" ends the
// flags.
func TestFlagsAfterArguments(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shop.db")
	dsn := "sqlite:" + path
	if code, out, errOut := idemq(t, "migrate", "--dsn", dsn); code != exitOK {
		t.Fatalf("migrate = %d:\n%s%s", code, out, errOut)
	}
	db, err := sqldedup.OpenSQLite(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	record(t, db, sqldedup.Config{Dialect: sqldedup.SQLite}, "checkout", "order-42", `{}`)
	record(t, db, sqldedup.Config{Dialect: sqldedup.SQLite}, "checkout", "-dash", `{}`)
	db.Close()

	for _, tc := range []struct {
		args []string
		code int
		want string // in stdout when code is exitOK, else in stderr
	}{
		{[]string{"inspect", "checkout", "order-42", "-dsn", dsn}, exitOK, "key           order-42"},
		{[]string{"inspect", "checkout", "order-42", "--dsn", dsn, "--json"}, exitOK, `"key": "order-42"`},
		{[]string{"inspect", "-dsn", dsn, "checkout", "-json", "order-42"}, exitOK, `"state": "processed"`},
		{[]string{"inspect", "order-42", "--dsn=" + dsn, "--scope", "checkout"}, exitOK, "key           order-42"},
		{[]string{"inspect", "--dsn", dsn, "--", "checkout", "-dash"}, exitOK, "key           -dash"},
		{[]string{"inspect", "checkout", "--dsn", dsn, "--", "-dash"}, exitOK, "key           -dash"},
		{[]string{"inspect", "checkout", "-dash", "--dsn", dsn}, exitUsage, "flag provided but not defined: -dash"},
		{[]string{"stats", "--json", "--dsn", dsn}, exitOK, `"records": 2`},
		{[]string{"migrate", "extra", "--dsn", dsn}, exitUsage, `unexpected arguments ["extra"]`},
		{[]string{"migrate", "extra", "--print", "--dsn", dsn}, exitUsage, `unexpected arguments ["extra"]`},
		{[]string{"migrate", "--outbox", "extra", "--dsn", dsn}, exitUsage, `unexpected arguments ["extra"]`},
		{[]string{"relay", "extra", "--stats", "--dsn", dsn}, exitUsage, `unexpected arguments ["extra"]`},
		{[]string{"version", "extra", "--help"}, exitOK, "usage: idemq version"},
		{[]string{"purge", "checkout", "order-42", "-dsn", dsn}, exitOK, "purged"},
		{[]string{"inspect", "checkout", "order-42", "-dsn", dsn}, exitFailure, `no record of key "order-42"`},
	} {
		t.Run(strings.ReplaceAll(strings.Join(tc.args, " "), dsn, "DSN"), func(t *testing.T) {
			code, out, errOut := idemq(t, tc.args...)
			got := out
			if tc.code != exitOK || strings.Contains(tc.want, "usage:") {
				got = errOut
			}
			if code != tc.code || !strings.Contains(got, tc.want) {
				t.Errorf("exit %d, want %d with %q; stdout:\n%s\nstderr:\n%s", code, tc.code, tc.want, out, errOut)
			}
		})
	}
}
