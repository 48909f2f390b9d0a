package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// schemaTimeout bounds creating and dropping a test schema.
const schemaTimeout = 30 * time.Second

// Schema creates a new PostgreSQL schema with a unique name derived from the
// test's name, and drops it (CASCADE) when the test and its subtests end.
// It returns the schema's name. Close connections that use the schema in
// earlier-registered cleanups or before the test returns, or the drop waits
// for their locks.
func Schema(t testing.TB, databaseURL string) string {
	t.Helper()
	name := schemaName(t.Name())
	ident := pgx.Identifier{name}.Sanitize()
	ctx, cancel := context.WithTimeout(context.Background(), schemaTimeout)
	defer cancel()
	if err := execSQL(ctx, databaseURL, "CREATE SCHEMA "+ident); err != nil {
		t.Fatalf("testenv: create schema %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), schemaTimeout)
		defer cancel()
		if err := execSQL(ctx, databaseURL, "SET lock_timeout = '20s'", "DROP SCHEMA IF EXISTS "+ident+" CASCADE"); err != nil {
			t.Errorf("testenv: drop schema %s (is a connection still holding locks in it?): %v", name, err)
		}
	})
	return name
}

// SchemaURL creates a schema as Schema does and returns databaseURL with
// search_path set to it, so that every connection made from the returned URL
// (pgx sends unknown URL parameters as run-time parameters) creates and finds
// its tables there.
func SchemaURL(t testing.TB, databaseURL string) string {
	t.Helper()
	name := Schema(t, databaseURL)
	u, err := WithSearchPath(databaseURL, name)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return u
}

// WithSearchPath returns databaseURL (a postgres:// URL) with its search_path
// parameter set to schema.
func WithSearchPath(databaseURL, schema string) (string, error) {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return "", fmt.Errorf("parse database URL: %w", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func execSQL(ctx context.Context, databaseURL string, statements ...string) error {
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	for _, s := range statements {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// schemaName turns a test name into a schema name: "t_", the name in lower
// case with other characters than [a-z0-9] turned into "_", cut to fit, and
// a random suffix. The result is at most 63 bytes, PostgreSQL's limit.
func schemaName(testName string) string {
	var b strings.Builder
	b.WriteString("t_")
	lastUnderscore := true
	for _, r := range strings.ToLower(testName) {
		if b.Len() >= 44 {
			break
		}
		if ('a' <= r && r <= 'z') || ('0' <= r && r <= '9') {
			b.WriteRune(r)
			lastUnderscore = false
		} else if !lastUnderscore {
			b.WriteByte('_')
			lastUnderscore = true
		}
	}
	if !lastUnderscore {
		b.WriteByte('_')
	}
	var suffix [6]byte
	_, _ = rand.Read(suffix[:])
	b.WriteString(hex.EncodeToString(suffix[:]))
	return b.String()
}
