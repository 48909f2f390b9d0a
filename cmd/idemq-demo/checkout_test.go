package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRunInMemoryOnSQLite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := runCheckoutWorker(ctx, checkoutOptions{
		broker: "memory", store: "sqlite", sqlitePath: filepath.Join(t.TempDir(), "c.db"),
		topic: "orders", publish: 200, accounts: 10, concurrency: 2, batch: 10, idle: time.Second,
	}, &out)
	if err != nil {
		t.Fatalf("runCheckoutWorker: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		"published 200 orders (20 of them twice) and 1 malformed order",
		"charged 200, duplicates absorbed 20, retried 0, dead-lettered 1",
		"ledger: 200 orders charged",
		", 0 charged twice",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestRunRejectsUnknownStore(t *testing.T) {
	err := runCheckoutWorker(context.Background(), checkoutOptions{broker: "memory", store: "mysql"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), `unknown store "mysql"`) {
		t.Fatalf("runCheckoutWorker = %v, want an unknown store error", err)
	}
}
