package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/redact"
)

// Worker states, as WorkerStatus.State names them.
const (
	// StateReady: the worker answered, ready (consumer.Health.Ready).
	StateReady = "ready"
	// StateNotReady: the worker answered, not ready: starting, draining,
	// or in an outage (a dependency failed OutageThreshold times in a
	// row).
	StateNotReady = "not ready"
	// StateGone: the worker did not answer its last scrape within
	// Config.ScrapeTimeout (the process died, or hangs), or answered
	// something that is not a health report.
	StateGone = "gone"
)

// WorkerStatus is what the console knows of a worker.
type WorkerStatus struct {
	Name string `json:"name"`
	// URL is Worker.URL with its secrets masked.
	URL   string `json:"url"`
	State string `json:"state"`
	// Report is the worker's last answer, nil before the first.
	Report *WorkerReport `json:"report,omitempty"`
	// Checked is the time of the last scrape; LastSeen of the last one
	// answered.
	Checked  time.Time `json:"checked"`
	LastSeen time.Time `json:"last_seen,omitzero"`
	// Error is why the last scrape failed.
	Error string `json:"error,omitempty"`
}

// WorkerReport is a runner's report: consumer.Health, as
// consumer.HealthHandler's readyz serves it, and what a WorkerReporter
// adds (absent from HealthHandler's).
type WorkerReport struct {
	consumer.Health
	// Stats are the runner's counters; nil from HealthHandler.
	Stats *consumer.Stats `json:"stats,omitempty"`
	// InFlight is the number of messages received and not settled yet;
	// nil from HealthHandler.
	InFlight *int64 `json:"in_flight,omitempty"`
	// Lag is the sum of the source's partition lags (consumer.LagReporter);
	// nil when unknown.
	Lag *int64 `json:"lag,omitempty"`
	// LastError is the last error that failed a message (retried or
	// dead-lettered), at LastErrorAt; empty without one.
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
}

// noRedirects scrapes the workers: a redirect is not a health report.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// maxReport bounds the bytes read from a worker's answer.
const maxReport = 1 << 16

// scrape reads one worker's report.
func (c *Console) scrape(ctx context.Context, w Worker) (*WorkerReport, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ScrapeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.URL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := noRedirects.Do(req)
	if err != nil {
		// The URL's error quotes the URL, which may carry a credential.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusServiceUnavailable {
		return nil, fmt.Errorf("answered %s", resp.Status)
	}
	var rep WorkerReport
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxReport)).Decode(&rep); err != nil {
		return nil, fmt.Errorf("not a health report: %w", err)
	}
	return &rep, nil
}

// scrapeAll scrapes every worker, concurrently, and returns their status.
func (c *Console) scrapeAll(ctx context.Context) []*WorkerStatus {
	out := make([]*WorkerStatus, len(c.cfg.Workers))
	var wg sync.WaitGroup
	for i, w := range c.cfg.Workers {
		wg.Go(func() {
			rep, err := c.scrape(ctx, w)
			now := time.Now()
			c.mu.Lock()
			defer c.mu.Unlock()
			st := c.workers[w.Name]
			if st == nil {
				st = &WorkerStatus{Name: w.Name, URL: c.scrub(redact.String(w.URL))}
				c.workers[w.Name] = st
			}
			st.Checked, st.Error = now, c.errText(err)
			switch {
			case err != nil:
				st.State = StateGone
			case rep.Ready:
				st.State, st.Report, st.LastSeen = StateReady, rep, now
			default:
				st.State, st.Report, st.LastSeen = StateNotReady, rep, now
			}
			cp := *st
			out[i] = &cp
		})
	}
	wg.Wait()
	return out
}

func (c *Console) workersPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "workers", "Workers — idemq console", map[string]any{"Workers": c.scrapeAll(r.Context())})
}

func (c *Console) workersJSON(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, c.scrapeAll(r.Context()))
}

// WorkerReporter serves a runner's WorkerReport: its health, counters,
// in-flight count, lag and last error, for the console's Workers page.
// Add it to the runner's consumer.Config.Hooks (it counts the messages
// received and settled, and keeps the last error), then mount
// Handler(runner) where the program serves HTTP. It is safe for
// concurrent use; its hooks cost two atomic additions per message.
type WorkerReporter struct {
	// Lag, when set, is asked for the source's lag at each scrape (a
	// kafkasource.Source). Defaults to nil: no lag reported.
	Lag consumer.LagReporter

	received, settled atomic.Int64
	mu                sync.Mutex
	lastErr           string
	lastErrAt         time.Time
}

// OnReceived counts a received message (consumer.HookReceived).
func (w *WorkerReporter) OnReceived(ctx context.Context, _ *consumer.Message) context.Context {
	w.received.Add(1)
	return ctx
}

// OnSettled counts a settled message, and keeps the error of one that
// failed (consumer.HookSettled).
func (w *WorkerReporter) OnSettled(_ context.Context, _ *consumer.Message, s consumer.SettleInfo) {
	w.settled.Add(1)
	if s.Err != nil && s.Outcome != consumer.OutcomeHandled && s.Outcome != consumer.OutcomeDuplicate {
		w.mu.Lock()
		w.lastErr, w.lastErrAt = cut(s.Err.Error(), maxLastError), time.Now()
		w.mu.Unlock()
	}
}

// Report returns r's report now; the lag is read within ctx.
func (w *WorkerReporter) Report(ctx context.Context, r *consumer.Runner) WorkerReport {
	st := r.Stats()
	inFlight := max(w.received.Load()-w.settled.Load(), 0)
	rep := WorkerReport{Health: r.Health(), Stats: &st, InFlight: &inFlight}
	w.mu.Lock()
	rep.LastError, rep.LastErrorAt = w.lastErr, w.lastErrAt
	w.mu.Unlock()
	if w.Lag != nil {
		if ls, err := w.Lag.Lag(ctx); err == nil {
			var n int64
			for _, l := range ls {
				n += l.Lag
			}
			rep.Lag = &n
		}
	}
	return rep
}

// Handler serves r's WorkerReport as JSON on GET and HEAD, with status 200
// when it is ready and 503 otherwise, like consumer.HealthHandler's
// readyz, whose fields it keeps.
func (w *WorkerReporter) Handler(r *consumer.Runner) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet && req.Method != http.MethodHead {
			rw.Header().Set("Allow", "GET, HEAD")
			http.Error(rw, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		rep := w.Report(req.Context(), r)
		status := http.StatusOK
		if !rep.Ready {
			status = http.StatusServiceUnavailable
		}
		writeJSON(rw, status, rep)
	})
}

// maxLastError bounds the bytes of WorkerReport.LastError.
const maxLastError = 1024

// cut returns s cut to n bytes at a rune boundary, marked when cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + " …"
}
