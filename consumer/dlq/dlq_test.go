package dlq_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer/dlq"
	"github.com/idemq/idemq/dedup"
)

// memBroker is a dead-letter store in memory: what Scan does with each
// letter is recorded.
type memBroker struct {
	letters  []*dlq.Letter
	replayed []string
	failAt   string // Scan fails when it is asked to replay this key
}

func (m *memBroker) Scan(_ context.Context, visit func(*dlq.Letter) dlq.Action) (int, error) {
	done := 0
	var kept []*dlq.Letter
	for i, l := range m.letters {
		switch visit(l) {
		case dlq.ActionReplay:
			if l.Key == m.failAt {
				m.letters = append(kept, m.letters[i:]...)
				return done, errors.New("origin down")
			}
			m.replayed = append(m.replayed, l.Key)
			done++
		case dlq.ActionPurge:
			done++
		case dlq.ActionStop:
			m.letters = append(kept, m.letters[i:]...)
			return done, nil
		default:
			kept = append(kept, l)
		}
	}
	m.letters = kept
	return done, nil
}

func (m *memBroker) Close() error { return nil }

type forgetter struct{ forgot []string }

func (f *forgetter) RecordFailure(context.Context, string, dedup.Record) (int, error) { return 1, nil }
func (f *forgetter) ForgetFailures(_ context.Context, scope, key string) error {
	f.forgot = append(f.forgot, scope+"/"+key)
	return nil
}

func newMem() *memBroker {
	at := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	return &memBroker{letters: []*dlq.Letter{
		{ID: "1", Key: "a-1", Reason: "bad SKU", Origin: "orders", DeadLetteredAt: at},
		{ID: "2", Key: "a-2", Reason: "Card declined", Origin: "orders", DeadLetteredAt: at.Add(time.Hour)},
		{ID: "3", Key: "b-1", Reason: "bad SKU", Origin: "", DeadLetteredAt: at.Add(2 * time.Hour)},
		{ID: "4", Key: "b-2", Reason: "bad sku", Origin: "orders"},
	}}
}

func ids(ls []*dlq.Letter) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.ID)
	}
	return out
}

func TestFilter(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		f    dlq.Filter
		want []string
	}{
		{dlq.Filter{}, []string{"1", "2", "3", "4"}},
		{dlq.Filter{Reason: "SKU"}, []string{"1", "3", "4"}},
		{dlq.Filter{Key: "a-*"}, []string{"1", "2"}},
		{dlq.Filter{Key: "?-1", Reason: "sku"}, []string{"1", "3"}},
		{dlq.Filter{Since: at.Add(time.Hour)}, []string{"2", "3"}},
		{dlq.Filter{Until: at.Add(time.Hour)}, []string{"1"}},
		{dlq.Filter{Limit: 3, Reason: "sku"}, []string{"1", "3", "4"}},
		{dlq.Filter{Limit: 2, Reason: "sku"}, []string{"1", "3"}},
		{dlq.Filter{IDs: []string{"2", "b-2", "nope"}}, []string{"2", "4"}},
		{dlq.Filter{IDs: []string{"1", "a-2"}, Reason: "sku"}, []string{"1"}},
	} {
		m := newMem()
		got, err := dlq.List(context.Background(), m, c.f)
		if err != nil || !slices.Equal(ids(got), c.want) {
			t.Errorf("List(%+v) = %v, %v; want %v", c.f, ids(got), err, c.want)
		}
		if len(m.letters) != 4 {
			t.Errorf("List(%+v) changed the store: %d letters left", c.f, len(m.letters))
		}
	}
	for _, f := range []dlq.Filter{{Key: "[a-"}, {Since: at, Until: at}, {Limit: -1}} {
		if err := f.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", f)
		}
	}
}

func TestReplay(t *testing.T) {
	ctx := context.Background()
	t.Run("dry run changes nothing", func(t *testing.T) {
		m := newMem()
		res, err := dlq.Replay(ctx, m, dlq.Filter{Key: "a-*"}, dlq.Options{DryRun: true})
		if err != nil || res.Done != 0 || !slices.Equal(ids(res.Letters), []string{"1", "2"}) || len(m.letters) != 4 || len(m.replayed) != 0 {
			t.Fatalf("dry run: %+v, %v; store %d letters, replayed %v", res, err, len(m.letters), m.replayed)
		}
		res, err = dlq.Purge(ctx, m, dlq.Filter{}, dlq.Options{DryRun: true})
		if err != nil || res.Done != 0 || len(res.Letters) != 4 || len(m.letters) != 4 {
			t.Fatalf("dry-run purge: %+v, %v; store %d letters", res, err, len(m.letters))
		}
	})
	t.Run("without origin kept and reported", func(t *testing.T) {
		m := newMem()
		f := &forgetter{}
		var progress []int
		res, err := dlq.Replay(ctx, m, dlq.Filter{Reason: "sku"}, dlq.Options{Failures: f, Scope: "orders", Progress: func(n int) { progress = append(progress, n) }})
		if !errors.Is(err, dlq.ErrNoOrigin) {
			t.Fatalf("Replay = %v, want ErrNoOrigin for b-1", err)
		}
		if res.Done != 2 || !slices.Equal(m.replayed, []string{"a-1", "b-2"}) || !slices.Equal(ids(m.letters), []string{"2", "3"}) {
			t.Fatalf("replayed %v (done %d), left %v", m.replayed, res.Done, ids(m.letters))
		}
		if !slices.Equal(f.forgot, []string{"orders/a-1", "orders/b-2"}) {
			t.Errorf("forgot %v, want the replayed keys' failure counts", f.forgot)
		}
		if progress[len(progress)-1] != 2 {
			t.Errorf("progress %v, want it to end at 2", progress)
		}
	})
	t.Run("an error stops it and a rerun goes on", func(t *testing.T) {
		m := newMem()
		m.failAt = "a-2"
		res, err := dlq.Replay(ctx, m, dlq.Filter{Key: "a-*"}, dlq.Options{})
		if err == nil || res.Done != 1 {
			t.Fatalf("Replay = %+v, %v; want 1 done and the error", res, err)
		}
		m.failAt = ""
		if res, err := dlq.Replay(ctx, m, dlq.Filter{Key: "a-*"}, dlq.Options{}); err != nil || res.Done != 1 {
			t.Fatalf("rerun = %+v, %v; want the one left", res, err)
		}
		if !slices.Equal(m.replayed, []string{"a-1", "a-2"}) {
			t.Errorf("replayed %v", m.replayed)
		}
	})
	t.Run("limit", func(t *testing.T) {
		m := newMem()
		if res, err := dlq.Purge(ctx, m, dlq.Filter{Limit: 1}, dlq.Options{}); err != nil || res.Done != 1 || len(m.letters) != 3 {
			t.Fatalf("purge limit 1: %+v, %v; %d left", res, err, len(m.letters))
		}
	})
}

func TestListMore(t *testing.T) {
	for _, c := range []struct {
		f    dlq.Filter
		n    int
		more bool
	}{
		{dlq.Filter{}, 4, false},
		{dlq.Filter{Limit: 4}, 4, false},
		{dlq.Filter{Limit: 3}, 3, true},
		{dlq.Filter{Limit: 2, Reason: "sku"}, 2, true},
		{dlq.Filter{Limit: 3, Reason: "sku"}, 3, false},
	} {
		ls, more, err := dlq.ListMore(context.Background(), newMem(), c.f)
		if err != nil || len(ls) != c.n || more != c.more {
			t.Errorf("ListMore(%+v) = %d letters, more %v, %v; want %d, %v", c.f, len(ls), more, err, c.n, c.more)
		}
	}
	if (dlq.Filter{}).Selective() || !(dlq.Filter{IDs: []string{"1"}}).Selective() || !(dlq.Filter{Limit: 1}).Selective() {
		t.Error("Selective: want false for the zero Filter only")
	}
}

func TestDigestID(t *testing.T) {
	a := dlq.DigestID([]byte("k"), []byte("v"), []byte("body"))
	if a != dlq.DigestID([]byte("k"), []byte("v"), []byte("body")) || len(a) != len("h-")+16 {
		t.Fatalf("DigestID = %q: want the same 18-character ID for the same parts", a)
	}
	for _, parts := range [][][]byte{
		{[]byte("k"), []byte("v"), []byte("bodz")},
		{[]byte("kv"), []byte(""), []byte("body")},
		{[]byte("k"), []byte("vbody")},
	} {
		if b := dlq.DigestID(parts...); b == a {
			t.Errorf("DigestID(%q) = %q, the ID of other parts", parts, b)
		}
	}
}
