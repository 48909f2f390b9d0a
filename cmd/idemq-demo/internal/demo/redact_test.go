package demo

import (
	"strings"
	"testing"
)

// TestWorkerDatabaseURLNotOnCommandLine: a worker's command line is visible
// to every user of the machine, so the PostgreSQL URL reaches it through the
// environment.
func TestWorkerDatabaseURLNotOnCommandLine(t *testing.T) {
	const url = "postgres://app:Pl4ntedS3cret@127.0.0.1/orders"
	o := WorkerOptions{Store: StorePostgres, DatabaseURL: url}
	if args := strings.Join(o.args(), " "); strings.Contains(args, "Pl4ntedS3cret") {
		t.Fatalf("worker command line holds the database URL: %s", args)
	}
	env := o.env()
	if len(env) != 1 || env[0] != WorkerDatabaseEnv+"="+url {
		t.Fatalf("worker environment %q", env)
	}
	t.Setenv(WorkerDatabaseEnv, url)
	got, err := ParseWorkerFlags(o.args())
	if err != nil || got.DatabaseURL != url {
		t.Fatalf("ParseWorkerFlags = %q, %v", got.DatabaseURL, err)
	}
}
