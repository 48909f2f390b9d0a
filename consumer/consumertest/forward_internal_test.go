package consumertest

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/runtest"
)

// fakeTx is the transaction type of the fake stores below.
type fakeTx struct{}

// bareTxStore implements TxStore and none of the optional interfaces; its
// methods are never called here.
type bareTxStore struct{ dedup.TxStore[*fakeTx] }

// fullTxStore implements every optional interface of a TxStore, with
// recognisable answers where one is checked.
type fullTxStore struct{ bareTxStore }

func (fullTxStore) BeginClaim(context.Context, string, []dedup.Record) (*fakeTx, []dedup.Claim, error) {
	return nil, nil, nil
}
func (fullTxStore) CommitChain(context.Context, *fakeTx, string, []dedup.Record) ([]dedup.Claim, bool, error) {
	return nil, false, nil
}
func (fullTxStore) IsAborted(error) bool     { return true }
func (fullTxStore) Failed(*fakeTx) bool      { return true }
func (fullTxStore) Ended(*fakeTx) bool       { return true }
func (fullTxStore) IsTransient(error) bool   { return true }
func (fullTxStore) PoolSize() int            { return 7 }
func (fullTxStore) Retention() time.Duration { return 3 * time.Hour }
func (fullTxStore) TableStats() (dedup.TableStats, bool) {
	return dedup.TableStats{At: time.Unix(1, 0)}, true
}
func (fullTxStore) ForgetEnded(context.Context, *fakeTx, string, string, []string) error { return nil }
func (fullTxStore) RecordFailure(context.Context, string, dedup.Record) (int, error)     { return 5, nil }
func (fullTxStore) ForgetFailures(context.Context, string, string) error                 { return nil }
func (fullTxStore) StoreResults(context.Context, *fakeTx, string, []dedup.Result) error  { return nil }
func (fullTxStore) CheckSchema(context.Context) error                                    { return errNoTable }

// errNoTable is fullTxStore's answer to CheckSchema.
var errNoTable = &dedup.SchemaError{Table: "t"}

// bareLeaseStore implements LeaseStore and none of the optional interfaces.
type bareLeaseStore struct{ dedup.LeaseStore }

// fullLeaseStore implements every optional interface of a LeaseStore.
type fullLeaseStore struct{ bareLeaseStore }

func (fullLeaseStore) ClaimBatch(context.Context, string, []dedup.Record, []string, time.Duration) ([]dedup.Claim, error) {
	return nil, nil
}
func (fullLeaseStore) RecordFailure(context.Context, string, dedup.Record) (int, error) {
	return 5, nil
}
func (fullLeaseStore) ForgetFailures(context.Context, string, string) error { return nil }
func (fullLeaseStore) Durability(context.Context) (dedup.Durability, error) {
	return dedup.Durability{Loss: "lossy"}, nil
}
func (fullLeaseStore) CompleteWithResult(context.Context, string, string, string, time.Duration, []byte) error {
	return nil
}

// forwarded says, for each interface of package dedup, which of the kit's
// store wrappers must have it when their store does: "tx" (ReplayTx's),
// "lease" (Replay's), both, or "kind" for the two store kinds themselves.
// The runner asserts the optional interfaces on the store it is given, so a
// wrapper that drops one makes a replay take another path than production.
var forwarded = map[string][]string{
	"TxStore":             {"kind"},
	"LeaseStore":          {"kind"},
	"BeginClaimer":        {"tx"},
	"CommitChainer":       {"tx"},
	"AbortClassifier":     {"tx"},
	"FailedTxReporter":    {"tx"},
	"EndedTxReporter":     {"tx"},
	"TransientClassifier": {"tx"},
	"PoolSizer":           {"tx"},
	"RetentionReporter":   {"tx"},
	"TableStatsReporter":  {"tx"},
	"SchemaChecker":       {"tx"},
	"BatchClaimer":        {"lease"},
	"FailureCounter":      {"tx", "lease"},
	"ResultStorer":        {"tx"},
	"ResultCompleter":     {"lease"},
	"DurabilityReporter":  {"lease"},
}

// conditional lists the interfaces a wrapper may have only when its store
// does: the runner behaves differently with a store that lacks them than
// with any answer a wrapper could give on its behalf.
var conditional = []string{"CommitChainer", "FailureCounter", "RetentionReporter"}

// ifaceType returns dedup's interface name, generic ones instantiated with
// *fakeTx.
func ifaceType(name string) reflect.Type {
	return map[string]reflect.Type{
		"BeginClaimer":        reflect.TypeFor[dedup.BeginClaimer[*fakeTx]](),
		"CommitChainer":       reflect.TypeFor[dedup.CommitChainer[*fakeTx]](),
		"AbortClassifier":     reflect.TypeFor[dedup.AbortClassifier](),
		"FailedTxReporter":    reflect.TypeFor[dedup.FailedTxReporter[*fakeTx]](),
		"EndedTxReporter":     reflect.TypeFor[dedup.EndedTxReporter[*fakeTx]](),
		"TransientClassifier": reflect.TypeFor[dedup.TransientClassifier](),
		"PoolSizer":           reflect.TypeFor[dedup.PoolSizer](),
		"RetentionReporter":   reflect.TypeFor[dedup.RetentionReporter](),
		"TableStatsReporter":  reflect.TypeFor[dedup.TableStatsReporter](),
		"SchemaChecker":       reflect.TypeFor[dedup.SchemaChecker](),
		"BatchClaimer":        reflect.TypeFor[dedup.BatchClaimer](),
		"FailureCounter":      reflect.TypeFor[dedup.FailureCounter](),
		"ResultStorer":        reflect.TypeFor[dedup.ResultStorer[*fakeTx]](),
		"ResultCompleter":     reflect.TypeFor[dedup.ResultCompleter](),
		"DurabilityReporter":  reflect.TypeFor[dedup.DurabilityReporter](),
	}[name]
}

// dedupInterfaces returns the exported interfaces package dedup declares.
func dedupInterfaces(t *testing.T) []string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", "dedup"))
	if err != nil {
		t.Fatal(err)
	}
	return runtest.ExportedInterfaces(t, dir)
}

// The store wrappers of ReplayTx and Replay have every optional interface
// of package dedup that their store has, pass the store's answers through,
// and do not claim the conditional ones when their store lacks them.
func TestWrappersForwardEveryOptionalInterface(t *testing.T) {
	rep := &Report{Calls: map[string]int{}, Committed: map[string]int{}}
	wrapTx := func(s dedup.TxStore[*fakeTx]) any {
		return txStoreFor(&countingStore[*fakeTx]{TxStore: s, pending: map[any][]string{}, report: rep})
	}
	wrapLease := func(s dedup.LeaseStore) any { return leaseStoreFor(&countingLeases{LeaseStore: s, report: rep}) }
	wrappers := map[string]struct{ full, bare any }{
		"tx":    {wrapTx(fullTxStore{}), wrapTx(bareTxStore{})},
		"lease": {wrapLease(fullLeaseStore{}), wrapLease(bareLeaseStore{})},
	}
	for _, name := range dedupInterfaces(t) {
		kinds, ok := forwarded[name]
		if !ok {
			t.Errorf("dedup.%s is not in forwarded: say which wrappers must forward it, and make them", name)
			continue
		}
		if slices.Contains(kinds, "kind") {
			continue
		}
		iface := ifaceType(name)
		if iface == nil {
			t.Errorf("dedup.%s: add it to ifaceType", name)
			continue
		}
		for _, kind := range kinds {
			w := wrappers[kind]
			if !reflect.TypeOf(w.full).Implements(iface) {
				t.Errorf("the %s wrapper over a store with dedup.%s does not implement it", kind, name)
			}
			if slices.Contains(conditional, name) && reflect.TypeOf(w.bare).Implements(iface) {
				t.Errorf("the %s wrapper over a store without dedup.%s implements it", kind, name)
			}
		}
	}

	// The answers are the store's.
	ctx := context.Background()
	full := wrappers["tx"].full
	if ps, ok := full.(dedup.PoolSizer); ok && ps.PoolSize() != 7 {
		t.Errorf("PoolSize through the wrapper = %d, want the store's 7", ps.PoolSize())
	}
	if rr, ok := full.(dedup.RetentionReporter); ok && rr.Retention() != 3*time.Hour {
		t.Errorf("Retention through the wrapper = %v, want the store's 3h", rr.Retention())
	}
	if tr, ok := full.(dedup.TableStatsReporter); ok {
		if st, ok := tr.TableStats(); !ok || !st.At.Equal(time.Unix(1, 0)) {
			t.Errorf("TableStats through the wrapper = %v, %v; want the store's", st, ok)
		}
	}
	if sc, ok := full.(dedup.SchemaChecker); ok && !errors.Is(sc.CheckSchema(ctx), errNoTable) {
		t.Errorf("CheckSchema through the wrapper = %v, want the store's %v", sc.CheckSchema(ctx), errNoTable)
	}
	for kind, w := range wrappers {
		if fc, ok := w.full.(dedup.FailureCounter); ok {
			if n, err := fc.RecordFailure(ctx, "s", dedup.Record{Key: "k"}); n != 5 || err != nil {
				t.Errorf("RecordFailure through the %s wrapper = %d, %v; want the store's 5", kind, n, err)
			}
		}
	}
	if dr, ok := wrappers["lease"].full.(dedup.DurabilityReporter); ok {
		if d, err := dr.Durability(ctx); d.Loss != "lossy" || err != nil {
			t.Errorf("Durability through the lease wrapper = %+v, %v; want the store's", d, err)
		}
	}
	if dr, ok := wrappers["lease"].bare.(dedup.DurabilityReporter); ok {
		if d, err := dr.Durability(ctx); d != (dedup.Durability{}) || err != nil {
			t.Errorf("Durability through the wrapper of a store without one = %+v, %v; want no loss", d, err)
		}
	}
	bare := wrappers["tx"].bare
	if sc, ok := bare.(dedup.SchemaChecker); ok && sc.CheckSchema(ctx) != nil {
		t.Errorf("CheckSchema through the wrapper of a store without one = %v, want nil", sc.CheckSchema(ctx))
	}
	if ps, ok := bare.(dedup.PoolSizer); ok && ps.PoolSize() != 0 {
		t.Errorf("PoolSize through the wrapper of a store without one = %d, want 0 (no limit known)", ps.PoolSize())
	}
	if tr, ok := bare.(dedup.TableStatsReporter); ok {
		if _, ok := tr.TableStats(); ok {
			t.Error("TableStats through the wrapper of a store without them reports a measurement")
		}
	}
}
