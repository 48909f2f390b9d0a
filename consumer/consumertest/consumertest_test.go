package consumertest_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/consumertest"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/dedupdriver"
	"github.com/idemq/idemq/dedup/pgdedup"
	"github.com/idemq/idemq/internal/testenv"
)

// recordingTB captures Fatalf instead of stopping the test.
type recordingTB struct {
	*testing.T
	failed string
}

func (r *recordingTB) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

// forgetful is a store whose driver never remembers a key: every delivery
// is new. It reports no capability, so that the store's pipelined
// BeginClaim (which would bypass this Claim) is not used.
type forgetful struct{ dedupdriver.Tx[pgx.Tx] }

func (f forgetful) Driver() dedupdriver.Tx[pgx.Tx] { return f }

func (forgetful) Caps() dedupdriver.Caps { return dedupdriver.Caps{} }

func (forgetful) Claim(_ context.Context, _ pgx.Tx, _ string, recs []dedup.Record) ([]dedup.Claim, error) {
	cs := make([]dedup.Claim, len(recs))
	for i, r := range recs {
		cs[i] = dedup.Claim{Key: r.Key, State: dedup.StateNew}
	}
	return cs, nil
}

func script() []consumertest.Delivery {
	return []consumertest.Delivery{
		{Key: "a", Body: []byte("a"), Fault: consumertest.Redelivered},
		{Key: "b", Body: []byte("b"), Fault: consumertest.ConcurrentDuplicate},
		{Key: "c", Body: []byte("c"), Fault: consumertest.CrashAfterCommit},
		{Key: "d", Body: []byte("d"), Fault: consumertest.ProducerDuplicate},
		{Key: "e", Body: []byte("e"), FailFirst: 1},
	}
}

func newStore(t *testing.T) *pgdedup.Store {
	pool, schema := testenv.SchemaPool(t)
	store, err := pgdedup.New(pool, pgdedup.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return store
}

func noop(context.Context, pgx.Tx, *consumer.Message) error { return nil }

func TestReplayPassesWithRealStore(t *testing.T) {
	for _, batch := range []int{1, 4} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) {
			rep := consumertest.ReplayTx(t, newStore(t), noop, script(), consumertest.Options{BatchSize: batch})
			rep.RequireExactlyOnce(t)
			if rep.Calls["e"] != 2 {
				t.Fatalf("FailFirst: 1 gave %d calls, want 2", rep.Calls["e"])
			}
			if rep.Duplicates == 0 {
				t.Fatal("no duplicate was delivered")
			}
		})
	}
}

// The kit must catch a store that does not deduplicate: every key that is
// delivered more than once must be reported with more than one effect.
//
// How many more is not fixed: the kit's broker redelivers a message whose
// delivery stayed in flight longer than its visibility timeout (200 ms), and
// with a store that forgets every key each redelivery is one more effect. On
// a loaded machine a delivery can take that long, which once turned "d: 2
// effects" into "d: 4 effects"; the slow subtest makes every first call
// outlast the visibility timeout to cover that case on every run. A
// concurrent duplicate may be acknowledged before the second worker asks,
// so key b is not checked.
func TestReplayCatchesMissingDedup(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler consumer.TxHandler[pgx.Tx]
	}{
		{"fast", noop},
		{"slower than the visibility timeout", slowFirstCalls(250 * time.Millisecond)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := consumertest.ReplayTx(t, forgetful{newStore(t).Driver()}, tc.handler, script(), consumertest.Options{})
			tb := &recordingTB{T: t}
			rep.RequireExactlyOnce(tb)
			for _, k := range []string{"a", "c", "d"} {
				m := regexp.MustCompile(`(?m)^\s*` + k + `: (\d+) effects`).FindStringSubmatch(tb.failed)
				if m == nil {
					t.Errorf("report does not flag key %s: %q", k, tb.failed)
					continue
				}
				if n, _ := strconv.Atoi(m[1]); n < 2 {
					t.Errorf("report flags key %s with %d effects, want at least 2 (it was delivered twice): %q", k, n, tb.failed)
				}
			}
		})
	}
}

// slowFirstCalls returns a handler whose first call of each key takes d.
func slowFirstCalls(d time.Duration) consumer.TxHandler[pgx.Tx] {
	var mu sync.Mutex
	seen := map[string]bool{}
	return func(ctx context.Context, _ pgx.Tx, m *consumer.Message) error {
		mu.Lock()
		first := !seen[m.Key]
		seen[m.Key] = true
		mu.Unlock()
		if first {
			time.Sleep(d)
		}
		return nil
	}
}
