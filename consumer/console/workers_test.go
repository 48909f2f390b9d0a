package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/consumer/console"
	"github.com/idemq/idemq/consumer/memsource"
	"github.com/idemq/idemq/dedup/memdedup"
	"github.com/idemq/idemq/internal/runtest"
)

// newRunner returns a runner of topic "orders" on a memsource broker whose
// handler fails the message with key "poison" for good.
func newRunner(t testing.TB, hooks ...consumer.Hook) (*consumer.Runner, *memsource.Broker) {
	t.Helper()
	store, err := memdedup.New(memdedup.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b := memsource.New(memsource.Config{})
	t.Cleanup(func() { b.Close() })
	r, err := consumer.NewRunner(b.Source("orders"), consumer.Transactional(store, func(_ context.Context, _ *memdedup.Tx, m *consumer.Message) error {
		if m.Key == "poison" {
			return consumer.Permanent(errors.New("bad SKU 17"))
		}
		return nil
	}), consumer.Config{Name: "orders", Hooks: hooks, Logger: runtest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return r, b
}

// fixedLag is a consumer.LagReporter with fixed lags.
type fixedLag []consumer.PartitionLag

func (f fixedLag) Lag(context.Context) ([]consumer.PartitionLag, error) { return f, nil }

// workers reads the console's workers.json.
func workers(t *testing.T, s *site) map[string]console.WorkerStatus {
	t.Helper()
	_, body := s.get(s.client(), "/workers.json")
	var ws []console.WorkerStatus
	if err := json.Unmarshal([]byte(body), &ws); err != nil {
		t.Fatalf("workers.json %q: %v", body, err)
	}
	out := map[string]console.WorkerStatus{}
	for _, w := range ws {
		out[w.Name] = w
	}
	return out
}

// The console scrapes each worker's endpoint: consumer.HealthHandler's
// readyz (health only) or a WorkerReporter's (in flight, last error too).
// A worker whose process ended, or that hangs, shows as gone at the first
// scrape after, which ScrapeTimeout bounds.
func TestConsoleWorkers(t *testing.T) {
	plainRunner, _ := newRunner(t)
	stopPlain := runtest.Start(t, plainRunner)
	plain := httptest.NewServer(http.StripPrefix("/health", consumer.HealthHandler(plainRunner)))
	t.Cleanup(plain.Close)

	rep := &console.WorkerReporter{Lag: fixedLag{{Topic: "orders", Partition: 0, Lag: 5}, {Topic: "orders", Partition: 1, Lag: 7}}}
	richRunner, broker := newRunner(t, rep)
	runtest.Start(t, richRunner)
	rich := httptest.NewServer(rep.Handler(richRunner))
	t.Cleanup(rich.Close)

	hung := make(chan struct{})
	hangs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hung:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(hung); hangs.Close() })

	s := newSite(t, console.Config{ScrapeTimeout: 300 * time.Millisecond, Workers: []console.Worker{
		{Name: "plain", URL: plain.URL + "/health/readyz"},
		{Name: "rich", URL: rich.URL + "/readyz"},
		{Name: "hangs", URL: hangs.URL + "/readyz"},
		{Name: "never", URL: "http://127.0.0.1:1/readyz"},
	}})

	broker.Publish("orders", memsource.Outgoing{Key: "ok-1", Body: []byte("{}")}, memsource.Outgoing{Key: "poison", Body: []byte("{}")})
	runtest.WaitFor(t, 10*time.Second, runtest.Say("both workers ready, the poison message dead-lettered"), func() bool {
		ws := workers(t, s)
		return ws["plain"].State == console.StateReady && ws["rich"].State == console.StateReady && richRunner.Stats().DeadLettered == 1
	})
	ws := workers(t, s)
	if r := ws["rich"].Report; r == nil || r.InFlight == nil || *r.InFlight != 0 || r.Stats == nil || r.Stats.Received != 2 || r.LastError == "" || r.Lag == nil || *r.Lag != 12 {
		t.Errorf("the reporter's worker: %+v", r)
	} else if !strings.Contains(r.LastError, "bad SKU 17") {
		t.Errorf("last error %q, want the handler's", r.LastError)
	}
	if r := ws["plain"].Report; r == nil || r.InFlight != nil || r.Stats != nil || !r.Running {
		t.Errorf("the HealthHandler's worker: %+v", r)
	}
	for _, name := range []string{"hangs", "never"} {
		if ws[name].State != console.StateGone || ws[name].Error == "" {
			t.Errorf("worker %s: %+v, want gone with the scrape's error", name, ws[name])
		}
	}
	_, page := s.get(s.client(), "/workers")
	for _, w := range []string{`data-worker="rich" data-state="ready"`, `<td class="last-error">permanent: bad SKU 17</td>`, `<td class="num lag">12</td>`, `data-worker="hangs" data-state="gone"`} {
		if !strings.Contains(page, w) {
			t.Errorf("workers page lacks %s", w)
		}
	}

	// The plain worker's process ends: its runner stops, its server
	// closes. The next scrape shows it gone, and when it was last seen.
	stopPlain()
	plain.Close()
	ended := time.Now()
	ws = workers(t, s)
	if p := ws["plain"]; p.State != console.StateGone || p.LastSeen.IsZero() || p.LastSeen.After(ended) {
		t.Errorf("a worker whose process ended: %+v, want gone, last seen before %s", p, ended)
	}
	if ws["rich"].State != console.StateReady {
		t.Errorf("the other worker: %+v", ws["rich"])
	}
}

// BenchmarkHealthScrape measures what one scrape of a worker costs the
// worker: one request to consumer.HealthHandler's readyz, and to a
// WorkerReporter's handler, served in process (no network).
func BenchmarkHealthScrape(b *testing.B) {
	rep := &console.WorkerReporter{}
	r, _ := newRunner(b, rep)
	runtest.Start(b, r)
	for _, c := range []struct {
		name string
		h    http.Handler
	}{
		{"HealthHandler", consumer.HealthHandler(r)},
		{"WorkerReporter", rep.Handler(r)},
	} {
		b.Run(c.name, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, "/health/readyz", nil)
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				c.h.ServeHTTP(w, req)
			}
		})
	}
}
