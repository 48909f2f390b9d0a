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
	"github.com/idemq/idemq/dedup/migrate"
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
	if err := store.Driver().StoreResults(ctx, tx, scope, []dedup.Result{{Key: key, Value: []byte(`{"charge":"ch_1"}`)}}); err != nil {
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

// A command's help, asked with `idemq help COMMAND` or `idemq COMMAND -h`
// (on stdout both), starts with a usage line that shows its
// positional arguments, then its flags; a usage error repeats the line.
func TestCommandHelpShowsArguments(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		code     int
		toStdout bool
		want     []string
	}{
		{[]string{"help", "inspect"}, exitOK, true, []string{"usage: idemq inspect [flags] SCOPE KEY\n", "-dsn DSN", "-json", "before or after the arguments"}},
		{[]string{"inspect", "-h"}, exitOK, true, []string{"usage: idemq inspect [flags] SCOPE KEY\n", "-scope"}},
		{[]string{"purge", "--help"}, exitOK, true, []string{"usage: idemq purge [flags] SCOPE KEY\n", "-dsn DSN"}},
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

// idemq migrate lists the migrations it applied (version and name), for
// the processed-messages table and the outbox table alike, and says
// "already up to date" when it applied none; --status lists them as
// applied.
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
			cfg := migrate.Config{Line: migrate.Dedup, Dialect: migrate.SQLite}
			if tc.outbox {
				cfg.Line = migrate.Outbox
			}
			if tc.postgres {
				cfg.Dialect = migrate.Postgres
			}
			m, err := migrate.NewSQL(nil, cfg)
			if err != nil {
				t.Fatal(err)
			}
			var want, applied []string
			for _, m := range m.AllVersions() {
				want = append(want, fmt.Sprintf("applied migration %d (%s) to ", m.Version, m.Name))
				applied = append(applied, fmt.Sprintf("applied  %d (%s)\n", m.Version, m.Name))
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
			code, out, errOut = idemq(t, append(args, "--status")...)
			for _, w := range append(applied, ": 0 pending\n") {
				if code != exitOK || !strings.Contains(out, w) {
					t.Errorf("migrate --status = %d, lacks %q:\n%s%s", code, w, out, errOut)
				}
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
			if tc.code != exitOK {
				got = errOut
			}
			if code != tc.code || !strings.Contains(got, tc.want) {
				t.Errorf("exit %d, want %d with %q; stdout:\n%s\nstderr:\n%s", code, tc.code, tc.want, out, errOut)
			}
		})
	}
}

// A command's help is output the user asked for: `idemq COMMAND -h`,
// `idemq COMMAND --help` and `idemq help COMMAND` print the same text on
// stdout, nothing on stderr, and exit 0.
func TestCommandHelpOnStdout(t *testing.T) {
	for _, c := range commands() {
		if c.hidden || c.run == nil {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			_, want, _ := idemq(t, "help", c.name)
			for _, args := range [][]string{{c.name, "-h"}, {c.name, "--help"}, {c.name, "-help"}, {"help", c.name}} {
				code, out, errOut := idemq(t, args...)
				if code != exitOK || errOut != "" || !strings.HasPrefix(out, "usage: "+c.synopsis()+"\n") || out != want {
					t.Errorf("idemq %q = %d, want %d, the help on stdout and nothing on stderr; stdout:\n%s\nstderr:\n%s", args, code, exitOK, out, errOut)
				}
			}
		})
	}
	// A subcommand's help is its command's.
	if code, out, errOut := idemq(t, "dlq", "list", "-h"); code != exitOK || errOut != "" || !strings.HasPrefix(out, "usage: idemq dlq") {
		t.Errorf("idemq dlq list -h = %d; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}

// An unknown flag is a usage error said once: the error, the usage line and
// where to find the flags, each one time, on stderr.
func TestUnknownFlagSaidOnce(t *testing.T) {
	const undefined = "flag provided but not defined: -bogus"
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"inspect", "--bogus", "checkout", "order-1"}, undefined},
		{[]string{"purge", "checkout", "order-1", "-bogus"}, undefined},
		{[]string{"migrate", "--bogus"}, undefined},
		{[]string{"stats", "--bogus"}, undefined},
		{[]string{"relay", "--bogus"}, undefined},
		{[]string{"dlq", "list", "--bogus"}, undefined},
		{[]string{"version", "--bogus"}, undefined},
		{[]string{"stats", "--json=maybe"}, `invalid boolean value "maybe" for -json`},
	} {
		args := tc.args
		code, out, errOut := idemq(t, args...)
		for _, once := range []string{tc.err, "usage: idemq " + args[0] + " ", "idemq help " + args[0]} {
			if n := strings.Count(errOut, once); n != 1 {
				t.Errorf("idemq %q: stderr has %q %d times, want once:\n%s", args, once, n, errOut)
			}
		}
		if code != exitUsage || out != "" || strings.Contains(errOut, "flags:\n") {
			t.Errorf("idemq %q = %d, want %d, no stdout and no flag list; stdout:\n%s\nstderr:\n%s", args, code, exitUsage, out, errOut)
		}
	}
}

// JSON output keeps <, > and & as they are: "<1h", not "\u003c1h".
func TestJSONNotHTMLEscaped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shop.db")
	dsn := "sqlite:" + path
	if code, out, errOut := idemq(t, "migrate", "--dsn", dsn); code != exitOK {
		t.Fatalf("migrate = %d:\n%s%s", code, out, errOut)
	}
	db, err := sqldedup.OpenSQLite(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	const key = "a<b>&c"
	record(t, db, sqldedup.Config{Dialect: sqldedup.SQLite}, "checkout", key, `{}`)
	db.Close()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"stats", "--dsn", dsn, "--json"}, `"<1h": 0`},
		{[]string{"inspect", "--dsn", dsn, "--json", "checkout", key}, `"key": "a<b>&c"`},
	} {
		code, out, errOut := idemq(t, tc.args...)
		if code != exitOK || !strings.Contains(out, tc.want) || strings.Contains(out, `\u00`) {
			t.Errorf("idemq %s = %d, want %s and no \\u00 escape; stdout:\n%s\nstderr:\n%s", tc.args[0], code, tc.want, out, errOut)
		}
	}
	var b strings.Builder
	if err := writeJSON(&b, map[string]string{"<1h": "a&b"}); err != nil || b.String() != "{\n  \"<1h\": \"a&b\"\n}\n" {
		t.Errorf("writeJSON = %q, %v", b.String(), err)
	}
}

// migrate --print connects to nothing, so it needs no DSN: without one it
// prints PostgreSQL's SQL; a DSN chooses the dialect.
func TestMigratePrintWithoutDSN(t *testing.T) {
	for _, name := range dsnEnv {
		t.Setenv(name, "")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "--print"}, `CREATE TABLE IF NOT EXISTS "public"."processed_messages"`},
		{[]string{"migrate", "--print", "--schema", "billing", "--table", "seen"}, `CREATE TABLE IF NOT EXISTS "billing"."seen"`},
		{[]string{"migrate", "--outbox", "--print"}, "idemq_outbox"},
	} {
		code, out, errOut := idemq(t, tc.args...)
		if code != exitOK || errOut != "" || !strings.Contains(out, tc.want) {
			t.Errorf("idemq %q = %d, want %d and %q; stdout:\n%s\nstderr:\n%s", tc.args, code, exitOK, tc.want, out, errOut)
		}
	}
	// Applying them does need one.
	if code, _, errOut := idemq(t, "migrate"); code != exitUsage || !strings.Contains(errOut, "--dsn is required") {
		t.Errorf("idemq migrate without a DSN = %d, want %d; stderr:\n%s", code, exitUsage, errOut)
	}
}

// inspect of a key without a record points to the dead-letter queue, where
// a message that failed for good is.
func TestInspectNoRecordPointsToDLQ(t *testing.T) {
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "shop.db")
	if code, out, errOut := idemq(t, "migrate", "--dsn", dsn); code != exitOK {
		t.Fatalf("migrate = %d:\n%s%s", code, out, errOut)
	}
	code, out, errOut := idemq(t, "inspect", "--dsn", dsn, "checkout", "order-9")
	if code != exitFailure || out != "" || strings.Contains(errOut, "never processed") ||
		!strings.Contains(errOut, `no record of key "order-9" in scope "checkout"`) ||
		!strings.Contains(errOut, "dead-letter queue: idemq dlq list ") || !strings.Contains(errOut, "--key order-9") {
		t.Errorf("inspect of an unknown key = %d; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	// A key the shell would split or expand is quoted.
	if _, _, errOut := idemq(t, "inspect", "--dsn", dsn, "checkout", "it's $HOME"); !strings.Contains(errOut, `--key 'it'\''s $HOME'`) {
		t.Errorf("inspect of a key with a quote: stderr:\n%s", errOut)
	}
}

// TestPurgeDryRunAndJSON: purge --dry-run names the record it would delete
// and deletes nothing; purge --json says what it did as JSON.
func TestPurgeDryRunAndJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shop.db")
	dsn := "sqlite:" + path
	if code, out, errOut := idemq(t, "migrate", "--dsn", dsn); code != exitOK {
		t.Fatalf("migrate = %d:\n%s%s", code, out, errOut)
	}
	db, err := sqldedup.OpenSQLite(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	record(t, db, sqldedup.Config{Dialect: sqldedup.SQLite}, "checkout", "order-7", `{}`)
	db.Close()

	code, out, errOut := idemq(t, "purge", "--dsn", dsn, "--dry-run", "checkout", "order-7")
	if code != exitOK || !strings.Contains(out, "dry run, nothing changed") || !strings.Contains(out, `"order-7"`) {
		t.Fatalf("purge --dry-run = %d:\n%s%s", code, out, errOut)
	}
	var got struct {
		Scope  string `json:"scope"`
		Key    string `json:"key"`
		Purged bool   `json:"purged"`
		DryRun bool   `json:"dry_run"`
	}
	code, out, errOut = idemq(t, "purge", "--dsn", dsn, "--dry-run", "--json", "checkout", "order-7")
	if code != exitOK {
		t.Fatalf("purge --dry-run --json = %d:\n%s%s", code, out, errOut)
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.Scope != "checkout" || got.Key != "order-7" || got.Purged || !got.DryRun {
		t.Fatalf("purge --dry-run --json = %+v (%v) from %q", got, err, out)
	}
	// The dry runs left the record: inspect still finds it.
	if code, _, errOut := idemq(t, "inspect", "--dsn", dsn, "checkout", "order-7"); code != exitOK {
		t.Fatalf("inspect after the dry runs = %d:\n%s", code, errOut)
	}
	code, out, errOut = idemq(t, "purge", "--dsn", dsn, "--json", "checkout", "order-7")
	if code != exitOK {
		t.Fatalf("purge --json = %d:\n%s%s", code, out, errOut)
	}
	got = struct {
		Scope  string `json:"scope"`
		Key    string `json:"key"`
		Purged bool   `json:"purged"`
		DryRun bool   `json:"dry_run"`
	}{}
	if err := json.Unmarshal([]byte(out), &got); err != nil || !got.Purged || got.DryRun {
		t.Fatalf("purge --json = %+v (%v) from %q", got, err, out)
	}
	if code, _, _ := idemq(t, "purge", "--dsn", dsn, "--dry-run", "checkout", "order-7"); code != exitFailure {
		t.Fatalf("purge --dry-run of a purged key = %d, want %d", code, exitFailure)
	}
}
