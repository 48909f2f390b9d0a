// Command idemq is idemq's command-line tool:
//
//	idemq migrate --dsn URL            # apply the processed-messages table migrations; lists those applied
//	idemq migrate --print [--dsn URL]  # print them instead: no connection (without a DSN, PostgreSQL's SQL)
//	idemq migrate --status --dsn URL   # list them as applied or pending
//	idemq migrate --outbox --dsn URL [--print]  # the same for the outbox table (sinks/outbox)
//	idemq relay --dsn URL --broker kafka|sqs|rabbitmq  # publish committed outbox rows; --stats shows their counts
//	idemq dlq list|show|replay|purge --broker kafka|sqs|rabbitmq --dlq TOPIC|QUEUE  # operate dead letters (docs/operations.md)
//	idemq console --dlq kafka:orders.dlq --dsn URL --worker NAME=URL  # the operator's web console (docs/operations.md)
//	idemq inspect --dsn URL SCOPE KEY  # show a processed record (or --scope SCOPE KEY)
//	idemq purge --dsn URL SCOPE KEY    # forget a record, so its next delivery runs again
//	idemq stats --dsn URL              # records per scope, their ages, table size, outbox rows
//	idemq version                      # the module version (or VCS revision) and the Go version
//
// A DSN is a PostgreSQL URL (postgres://...) or a SQLite file
// (sqlite:path/to/file.db, or a path ending in .db, .sqlite or .sqlite3).
// Flags may come before or after a command's arguments; "--" ends them.
// inspect, purge and stats never create a missing SQLite file: they report
// that it, and so the table, does not exist.
// Run `idemq help COMMAND` or `idemq COMMAND -h` for a command's arguments
// and flags (on stdout). Exit status: 0 on success and for help, 1 when the
// command failed, 2 for a usage error.
// The zero-setup demo is a program of its own: `make demo` (cmd/idemq-demo).
package main

import (
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}
