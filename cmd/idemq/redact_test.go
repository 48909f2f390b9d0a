package main

import (
	"bytes"
	"context"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/idemq/idemq/dedup/sqldedup"
	"github.com/idemq/idemq/internal/redact"
	"github.com/idemq/idemq/internal/testenv"
	"github.com/idemq/idemq/sinks/outbox"
	"github.com/idemq/idemq/sinks/outbox/amqpoutbox"
	"github.com/idemq/idemq/sinks/outbox/sqsoutbox"
	"github.com/idemq/idemq/sinks/webhook"
	"github.com/idemq/idemq/sources/amqpsource"
	"github.com/idemq/idemq/sources/sqssource"
)

// plantedSecret is put in the password and the secret query parameters
// (sslpassword, a token) of every DSN below; no output may show it. The
// database names and file paths are shown (TestErrorsShowWhatUserTyped).
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
	wrongDB.Path = "/idemq_no_such_db"
	wrongDB.RawQuery = "sslmode=disable&sslpassword=" + plantedSecret
	// Nothing listens: the driver's error names user and database.
	closed := "postgres://idemq:" + plantedSecret + "@127.0.0.1:1/orders?sslpassword=" + plantedSecret
	sqlitePath := "sqlite:" + filepath.Join(t.TempDir(), "missing-dir", "shop.db")
	keyValue := "host=127.0.0.1 port=1 user=idemq password='" + plantedSecret + "' dbname=orders sslpassword=" + plantedSecret

	for _, name := range []string{"IDEMQ_DSN", "DATABASE_URL", "TEST_DATABASE_URL"} {
		t.Setenv(name, closed)
	}
	closedAMQP := "amqp://idemq:" + plantedSecret + "@127.0.0.1:1/vhost"
	t.Setenv("IDEMQ_AMQP_URL", closedAMQP)
	t.Setenv("IDEMQ_SQS_ENDPOINT", "http://key:"+plantedSecret+"@127.0.0.1:1/?X-Amz-Security-Token="+plantedSecret)
	t.Setenv("KAFKA_BROKERS", "127.0.0.1:1")

	runs := [][]string{{"help"}}
	for _, c := range commands() {
		if !c.hidden {
			runs = append(runs, []string{"help", c.name}, []string{c.name, "-h"}, []string{c.name, "--help"})
		}
	}
	runs = append(runs,
		[]string{"migrate"}, // the DSN of $IDEMQ_DSN, unreachable
		[]string{"migrate", "--dsn", "mysql://idemq:" + plantedSecret + "@127.0.0.1/shop"},
		[]string{"migrate", "--dsn", "mysql://idemq:" + plantedSecret + "@tcp(127.0.0.1)/shop"},
		[]string{"migrate", "--dsn=" + keyValue},
		[]string{"migrate", "--dsn", "idemq:" + plantedSecret + "@not-a-dsn"},
		[]string{"migrate", "--dsn", wrongDB.String()},
		[]string{"migrate", "--dsn", sqlitePath},
		[]string{"migrate", "--print", "--dsn", closed, "--schema", "bad schema"},
		[]string{"inspect", "--dsn", wrongDB.String(), "--scope", "s", "k"},
		[]string{"inspect", "--scope", "s", "k"},
		[]string{"inspect", "-dsn", sqlitePath, "--scope", "s", "k"},
		[]string{"purge", "--dsn", closed, "--scope", "s", "k"},
		[]string{"purge", "--dsn", wrongDB.String(), "--scope", "s", "k"},
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

// TestNoSecretInConstructorErrors gives every constructor that takes a URL
// (the sources, the outbox publishers, the webhook sink) one with the secret
// planted in its password and path, unparsable (url.Parse's error quotes the
// whole URL) or pointing where nothing listens, and greps the errors of the
// constructor and of its first use. The CLI scrubs its own output; a
// library's user logs these errors as they are.
func TestNoSecretInConstructorErrors(t *testing.T) {
	badPort := func(scheme string) string {
		return scheme + "://guest:" + plantedSecret + "@127.0.0.1:notaport/" + plantedSecret
	}
	closed := func(scheme string) string {
		return scheme + "://guest:" + plantedSecret + "@127.0.0.1:1/" + plantedSecret
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	check := func(name string, err error) {
		t.Helper()
		if err != nil && strings.Contains(err.Error(), plantedSecret) {
			t.Errorf("%s: the error shows the secret: %v", name, err)
		}
	}
	for _, u := range []string{badPort("amqp"), closed("amqp"), badPort("amqps")} {
		src, err := amqpsource.New(ctx, amqpsource.Config{URL: u, Queue: "q", ConnectTimeout: 2 * time.Second})
		if err == nil {
			_ = src.Close()
			t.Errorf("amqpsource.New(%s) succeeded", redact.String(u))
		}
		check("amqpsource.New", err)

		p, err := amqpoutbox.New(amqpoutbox.Config{URL: u})
		check("amqpoutbox.New", err)
		if err == nil {
			err = p.Publish(ctx, []outbox.Message{{Destination: "q", Body: []byte("b")}})
			_ = p.Close()
			if err == nil {
				t.Errorf("amqpoutbox Publish to %s succeeded", redact.String(u))
			}
			check("amqpoutbox Publish", err)
		}
	}
	// An SQS queue URL names an account and a queue and carries no
	// credential: the errors of sqssource.New quote it. Its endpoint may.
	for _, u := range []string{badPort("http"), closed("http"), "127.0.0.1:" + plantedSecret} {
		_, err := webhook.New(webhook.Config{URL: u})
		check("webhook.New", err)
		u = strings.TrimSuffix(u, "/"+plantedSecret)
		c, err := sqssource.NewClient(ctx, u, config.WithRegion("elasticmq"),
			config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("x", "y", "")),
			config.WithRetryMaxAttempts(1))
		check("sqssource.NewClient", err)
		if err != nil {
			continue
		}
		src, err := sqssource.New(ctx, c, sqssource.Config{QueueURL: "http://127.0.0.1:1/000000000000/queue"})
		if err == nil {
			_ = src.Close()
			t.Errorf("sqssource.New on %s succeeded", redact.String(u))
		}
		check("sqssource.New", err)
		p, err := sqsoutbox.New(c)
		check("sqsoutbox.New", err)
		if err == nil {
			check("sqsoutbox Publish", p.Publish(ctx, []outbox.Message{{Destination: "q", Body: []byte("b")}}))
		}
	}
	// The relay command with the same URLs: one pending row makes it
	// publish; its log goes to stderr as it is, its error through scrub.
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "outbox.db")
	if code, out, errOut := idemq(t, "migrate", "--outbox", "--dsn", dsn); code != exitOK {
		t.Fatalf("migrate --outbox = %d:\n%s%s", code, out, errOut)
	}
	db, err := sqldedup.OpenSQLite(ctx, strings.TrimPrefix(dsn, "sqlite:"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.PublishSQL(ctx, db, outbox.Message{ID: "o-1", Destination: "q", Key: "q", Body: []byte("b")}); err != nil {
		_ = db.Close()
		t.Fatal(err)
	}
	_ = db.Close()
	for i, args := range [][]string{
		{"--broker", "rabbitmq", "--dsn", dsn, "--poll", "50ms", "--amqp-url", badPort("amqp")},
		{"--broker", "rabbitmq", "--dsn", dsn, "--poll", "50ms", "--amqp-url", closed("amqp")},
		{"--broker", "sqs", "--dsn", dsn, "--poll", "50ms", "--sqs-endpoint", badPort("http")},
	} {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		var errOut bytes.Buffer
		err := runRelay(rctx, args, &bytes.Buffer{}, &errOut)
		rcancel()
		all := errOut.String()
		if err != nil {
			all += scrub(err, args)
		}
		if strings.Contains(all, plantedSecret) {
			t.Errorf("run %d, idemq relay %s, shows the secret:\n%s", i, args[1], all)
		}
	}
}
