package consumertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
)

// fakeTx is the transaction type of the fake drivers below.
type fakeTx struct{}

// fakeTxDriver reports caps and answers recognisably where one is checked;
// its other methods are never called here.
type fakeTxDriver struct {
	dedupdriver.Tx[*fakeTx]
	caps dedupdriver.Caps
}

func (d fakeTxDriver) Caps() dedupdriver.Caps                                            { return d.caps }
func (fakeTxDriver) IsAborted(error) bool                                                { return true }
func (fakeTxDriver) IsTransient(error) bool                                              { return true }
func (fakeTxDriver) PoolSize() int                                                       { return 7 }
func (fakeTxDriver) RecordFailure(context.Context, string, dedup.Record) (int, error)    { return 5, nil }
func (fakeTxDriver) CheckSchema(context.Context) error                                   { return errNoTable }
func (fakeTxDriver) StoreResults(context.Context, *fakeTx, string, []dedup.Result) error { return nil }

// errNoTable is fakeTxDriver's answer to CheckSchema.
var errNoTable = &dedup.SchemaError{Table: "t"}

type fakeTxStore struct{ d fakeTxDriver }

func (s fakeTxStore) Driver() dedupdriver.Tx[*fakeTx] { return s.d }

// fakeLeaseDriver reports caps; its other methods are never called here.
type fakeLeaseDriver struct {
	dedupdriver.Lease
	caps dedupdriver.Caps
}

func (d fakeLeaseDriver) Caps() dedupdriver.Caps { return d.caps }
func (fakeLeaseDriver) RecordFailure(context.Context, string, dedup.Record) (int, error) {
	return 5, nil
}

type fakeLeaseStore struct{ d fakeLeaseDriver }

func (s fakeLeaseStore) Driver() dedupdriver.Lease { return s.d }

// The drivers ReplayTx and Replay hand the Runner report the Caps of their
// store's driver, whatever it is, and pass its answers through: a replay
// takes the Runner's paths for that store.
func TestWrappersForwardTheDriver(t *testing.T) {
	rep := &Report{Calls: map[string]int{}, Committed: map[string]int{}}
	ctx := context.Background()
	for _, caps := range []dedupdriver.Caps{
		{},
		{BeginClaim: true, CommitChain: true, Aborted: true, FailedTx: true, EndedTx: true, Transient: true,
			Pool: true, Retention: 3 * time.Hour, SchemaCheck: true, FailureCount: true, Results: true},
		{Aborted: true, Transient: true, Pool: true, Retention: time.Hour, SchemaCheck: true, FailureCount: true, Results: true},
	} {
		var store dedupdriver.TxStore[*fakeTx] = fakeTxStore{fakeTxDriver{caps: caps}}
		var w dedupdriver.TxStore[*fakeTx] = &countingStore[*fakeTx]{Tx: store.Driver(), pending: map[any][]string{}, report: rep}
		d := w.Driver()
		if got := d.Caps(); got != caps {
			t.Errorf("Caps through the tx wrapper = %+v, want the store's %+v", got, caps)
		}
		if d.PoolSize() != 7 || !d.IsAborted(nil) || !d.IsTransient(nil) {
			t.Error("PoolSize, IsAborted or IsTransient through the tx wrapper is not the store's")
		}
		if n, err := d.RecordFailure(ctx, "s", dedup.Record{Key: "k"}); n != 5 || err != nil {
			t.Errorf("RecordFailure through the tx wrapper = %d, %v; want the store's 5", n, err)
		}
		if err := d.CheckSchema(ctx); !errors.Is(err, errNoTable) {
			t.Errorf("CheckSchema through the tx wrapper = %v, want the store's %v", err, errNoTable)
		}
	}
	for _, caps := range []dedupdriver.Caps{{}, {BatchClaim: true, FailureCount: true, Results: true}} {
		var store dedupdriver.LeaseStore = fakeLeaseStore{fakeLeaseDriver{caps: caps}}
		var w dedupdriver.LeaseStore = &countingLeases{Lease: store.Driver(), report: rep}
		d := w.Driver()
		if got := d.Caps(); got != caps {
			t.Errorf("Caps through the lease wrapper = %+v, want the store's %+v", got, caps)
		}
		if n, err := d.RecordFailure(ctx, "s", dedup.Record{Key: "k"}); n != 5 || err != nil {
			t.Errorf("RecordFailure through the lease wrapper = %d, %v; want the store's 5", n, err)
		}
	}
}
