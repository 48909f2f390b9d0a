package main

import (
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemq/idemq/internal/testenv"
)

// plantedSecret is put in the password, database name, path and query of
// every DSN below; no output may show it.
const plantedSecret = "Pl4ntedS3cret"

// TestNoSecretInOutput runs the help of every command and failing commands
// with a secret planted in the DSNs of the environment and of the flags, and
// greps everything they print.
func TestNoSecretInOutput(t *testing.T) {
	pg, err := url.Parse(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	// A real server, a database that does not exist: the server's error
	// quotes the database name.
	wrongDB := *pg
	wrongDB.User = url.UserPassword(pg.User.Username(), plantedSecret)
	wrongDB.Path = "/" + plantedSecret + "_db"
	wrongDB.RawQuery = "sslmode=disable&application_name=" + plantedSecret
	// Nothing listens: the driver's error names user and database.
	closed := "postgres://idemq:" + plantedSecret + "@127.0.0.1:1/" + plantedSecret + "?sslpassword=" + plantedSecret
	sqlitePath := "sqlite:" + filepath.Join(t.TempDir(), "missing-"+plantedSecret, plantedSecret+".db")
	keyValue := "host=127.0.0.1 port=1 user=idemq password='" + plantedSecret + "' dbname=" + plantedSecret

	for _, name := range []string{"IDEMQ_DSN", "DATABASE_URL", "TEST_DATABASE_URL"} {
		t.Setenv(name, closed)
	}
	closedAMQP := "amqp://idemq:" + plantedSecret + "@127.0.0.1:1/" + plantedSecret
	t.Setenv("IDEMQ_AMQP_URL", closedAMQP)
	t.Setenv("IDEMQ_SQS_ENDPOINT", "http://key:"+plantedSecret+"@127.0.0.1:1/"+plantedSecret)
	t.Setenv("KAFKA_BROKERS", "127.0.0.1:1")

	runs := [][]string{{"help"}}
	for _, c := range commands() {
		if !c.hidden {
			runs = append(runs, []string{"help", c.name}, []string{c.name, "-h"}, []string{c.name, "--help"})
		}
	}
	runs = append(runs,
		[]string{"migrate"}, // the DSN of $IDEMQ_DSN, unreachable
		[]string{"migrate", "--dsn", "mysql://idemq:" + plantedSecret + "@127.0.0.1/" + plantedSecret},
		[]string{"migrate", "--dsn=" + keyValue},
		[]string{"migrate", "--dsn", plantedSecret + "-not-a-dsn"},
		[]string{"migrate", "--dsn", wrongDB.String()},
		[]string{"migrate", "--dsn", sqlitePath},
		[]string{"migrate", "--print", "--dsn", closed, "--schema", "bad schema"},
		[]string{"inspect", "--dsn", wrongDB.String(), "--scope", "s", "k"},
		[]string{"inspect", "--scope", "s", "k"},
		[]string{"inspect", "-dsn", sqlitePath, "--scope", "s", "k"},
		[]string{"purge", "--dsn", closed, "--scope", "s", "k"},
		[]string{"purge", "--dsn", wrongDB.String(), "--scope", "s", "k"},
		[]string{"demo", "--store", "postgres", "--broker", "memory", "--messages", "1", "--kills", "-1"},
		[]string{"demo", "--store", "postgres", "--db", wrongDB.String(), "--broker", "memory", "--messages", "1", "--kills", "-1"},
		[]string{"demo", "--store", "postgres", "--db=" + keyValue, "--broker", "memory", "--messages", "1", "--kills", "-1"},
		[]string{"relay", "--broker", "rabbitmq", "--dsn", sqlitePath},
		[]string{"relay", "--broker", "rabbitmq", "--dsn", wrongDB.String(), "--amqp-url", closedAMQP + "x"},
		[]string{"relay", "--stats", "--dsn", wrongDB.String()},
		[]string{"relay", "--broker", "pulsar", "--dsn", closed},
		[]string{"stats", "--dsn", wrongDB.String()},
		[]string{"stats", "--dsn", sqlitePath},
	)
	for i, args := range runs {
		code, out, errOut := idemq(t, args...)
		all := out + errOut
		// The command line itself holds the secret: name the run by its index.
		if strings.Contains(all, plantedSecret) {
			t.Errorf("run %d, idemq %s (exit %d), shows the secret:\n%s", i, args[0], code, all)
		}
		if len(args) > 1 && args[0] != "help" && !strings.HasPrefix(args[1], "-h") && !strings.HasPrefix(args[1], "--help") && code == exitOK {
			t.Errorf("run %d, idemq %s, succeeded; the test wants its failure output:\n%s", i, args[0], all)
		}
		if strings.Contains(all, "xxxxx") {
			t.Logf("run %d, idemq %s:\n%s", i, args[0], all)
		}
	}
}

// TestHelpOfHelp: asking for the help of help printed nothing but recursed
// until the stack overflowed.
func TestHelpOfHelp(t *testing.T) {
	for _, args := range [][]string{{"help", "help"}, {"help", "-h"}, {"-h", "--help"}, {"--help", "help"}} {
		if code, out, _ := idemq(t, args...); code != exitOK || !strings.Contains(out, "usage: idemq COMMAND") {
			t.Errorf("idemq %q = %d:\n%s", args, code, out)
		}
	}
}
