package otelidemq_test

import (
	"context"
	"testing"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/memdedup"
)

// The in-memory rig of this package's tests: a memdedup store, a memsource
// broker, and Runners that report to a telemetry's hook.

// runner is consumer.NewRunner with tel's hook added to cfg.Hooks and
// cfg.Name defaulting to "c"; an error fails t.
func (tel *telemetry) runner(t testing.TB, src consumer.Source, path consumer.Path, cfg consumer.Config) *consumer.Runner {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "c"
	}
	cfg.Hooks = append(cfg.Hooks, tel.hook)
	r, err := consumer.NewRunner(src, path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// succeed is a transactional handler that does nothing and succeeds.
func succeed(context.Context, *memdedup.Tx, *consumer.Message) error { return nil }

// memStore returns an empty in-memory dedup store.
func memStore(t testing.TB) *memdedup.Store {
	t.Helper()
	s, err := memdedup.New(memdedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// memBroker returns an in-memory broker closed when t ends.
func memBroker(t testing.TB, cfg memsource.Config) *memsource.Broker {
	b := memsource.New(cfg)
	t.Cleanup(func() { _ = b.Close() })
	return b
}
