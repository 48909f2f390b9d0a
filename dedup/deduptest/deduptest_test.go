package deduptest_test

import (
	"testing"
	"time"

	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/dedup/deduptest"
	"github.com/idemq/idemq/dedup/memdedup"
)

// The suites check themselves against the in-memory reference store; the
// real stores run them in their own packages against their servers.

func TestTxStoreSuiteOnMemstore(t *testing.T) {
	deduptest.RunTxStore(t, func(t *testing.T, retention time.Duration) dedupdriver.TxStore[*memdedup.Tx] {
		s, err := memdedup.New(memdedup.Config{Retention: retention})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestLeaseStoreSuiteOnMemstore(t *testing.T) {
	deduptest.RunLeaseStore(t, func(t *testing.T) dedupdriver.LeaseStore {
		s, err := memdedup.New(memdedup.Config{})
		if err != nil {
			t.Fatal(err)
		}
		return s.Leases()
	})
}

func TestFailureCounterSuiteOnMemstore(t *testing.T) {
	deduptest.RunFailureCounter(t, func(t *testing.T, retention time.Duration) dedupdriver.Common {
		s, err := memdedup.New(memdedup.Config{Retention: retention})
		if err != nil {
			t.Fatal(err)
		}
		return s.Driver()
	})
}
