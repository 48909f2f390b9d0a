package console

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemq/idemq/consumer/dlq"
	"github.com/idemq/idemq/dedup"
)

// page is what the layout template gets.
type page struct {
	// Page is the template's name, the body's id (page-NAME).
	Page     string
	Title    string
	Prefix   string
	CSRF     string
	SignedIn bool
	Mutable  bool
	// CanMutate: mutations are accepted and the browser is signed in, so
	// the pages show the replay and purge buttons.
	CanMutate bool
	ReadOnly  bool
	Queues    []Queue
	Outbox    bool
	Dedup     bool
	Workers   bool
	Path      string
	Now       time.Time
	Data      map[string]any
}

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"ago": func(t time.Time, now time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return shortDuration(now.Sub(t)) + " ago"
	},
	"dur": shortDuration,
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"bytes": bytesString,
	"slug":  func(s string) string { return strings.ReplaceAll(s, " ", "-") },
}

// parsePages parses each page with the layout.
func parsePages() (map[string]*template.Template, error) {
	names, err := fs.Glob(assets, "assets/templates/*.html")
	if err != nil {
		return nil, err
	}
	out := map[string]*template.Template{}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "assets/templates/"), ".html")
		if base == "layout" {
			continue
		}
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "assets/templates/layout.html", n)
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", n, err)
		}
		out[base] = t
	}
	return out, nil
}

// render writes page name with data, inside the layout.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name, title string, data map[string]any) {
	p := page{
		Page: name, Title: title, Prefix: c.cfg.Prefix, CSRF: c.csrf(w, r), SignedIn: c.signedIn(r), Mutable: c.mutable(),
		ReadOnly: c.cfg.ReadOnly, Queues: c.cfg.Queues, Outbox: c.cfg.Outbox != nil, Dedup: c.cfg.Dedup != nil,
		Workers: len(c.cfg.Workers) > 0, Path: r.URL.Path, Now: time.Now(), Data: data,
	}
	p.CanMutate = p.Mutable && p.SignedIn
	var buf bytes.Buffer
	if err := c.pages[name].Execute(&buf, p); err != nil {
		c.log(r.Context(), slog.LevelError, "console: render a page", slog.String("page", name), slog.String("error", c.errText(err)))
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// writeJSON answers v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// queueSummary is a queue's line on the overview.
type queueSummary struct {
	Name    string `json:"name"`
	Broker  string `json:"broker"`
	Count   int    `json:"count"`
	More    bool   `json:"more"`
	Groups  int    `json:"groups"`
	Busy    bool   `json:"busy"`
	Error   string `json:"error,omitempty"`
	Display string `json:"display"`
}

// overviewData reads every store, concurrently.
func (c *Console) overviewData(ctx context.Context) map[string]any {
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	qs := make([]queueSummary, len(c.cfg.Queues))
	var wg sync.WaitGroup
	for i := range c.cfg.Queues {
		wg.Go(func() {
			q := &c.cfg.Queues[i]
			ls, more, busy, err := c.list(ctx, q, dlq.Filter{})
			s := queueSummary{Name: q.Name, Broker: q.Broker, Count: len(ls), More: more, Groups: len(groupLetters(ls)),
				Busy: busy, Error: c.errText(err), Display: countString(len(ls), more)}
			if busy {
				s.Display = "replay or purge running"
			}
			qs[i] = s
		})
	}
	var ob *OutboxStats
	var obErr string
	if c.cfg.Outbox != nil {
		wg.Go(func() {
			st, err := c.cfg.Outbox.OutboxStats(ctx)
			if err != nil {
				obErr = c.errText(err)
				c.log(ctx, slog.LevelWarn, "console: read the outbox", slog.String("error", obErr))
				return
			}
			ob = &st
		})
	}
	var ws []*WorkerStatus
	wg.Go(func() { ws = c.scrapeAll(ctx) })
	wg.Wait()
	return map[string]any{"Queues": qs, "Outbox": ob, "OutboxError": obErr, "WorkerStatus": ws}
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "overview", "idemq console — overview", c.overviewData(r.Context()))
}

func (c *Console) overviewJSON(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, c.overviewData(r.Context()))
}

// countString is "12", or "1000+" when more were left unread.
func countString(n int, more bool) string {
	if more {
		return fmt.Sprintf("%d+", n)
	}
	return fmt.Sprint(n)
}

// list reads up to listLimit dead letters of q matching f, within
// readTimeout. busy reports that a replay or purge of q is running: then
// nothing is read, since a second reader would hide dead letters from it
// (SQS, RabbitMQ).
func (c *Console) list(ctx context.Context, q *Queue, f dlq.Filter) (ls []*dlq.Letter, more, busy bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	if c.running(q) != nil {
		return nil, false, true, nil
	}
	select {
	case c.scans[q.Name] <- struct{}{}:
	case <-ctx.Done():
		return nil, false, false, ctx.Err()
	}
	defer func() { <-c.scans[q.Name] }()
	if c.running(q) != nil {
		return nil, false, true, nil
	}
	b, err := q.Open(ctx)
	if err == nil {
		defer b.Close()
		f.Limit = listLimit
		ls, more, err = dlq.ListMore(ctx, b, f)
	}
	if err != nil {
		c.log(ctx, slog.LevelWarn, "console: list dead letters", slog.String("queue", q.Name), slog.String("error", c.errText(err)))
	}
	return ls, more, false, err
}

// running returns the replay or purge of q that is running, or nil.
func (c *Console) running(q *Queue) *job {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.busy[q.Name]
}

func (c *Console) queuePage(w http.ResponseWriter, r *http.Request, q *Queue) {
	f := dlq.Filter{Reason: r.URL.Query().Get("reason"), Key: r.URL.Query().Get("key")}
	group := r.URL.Query().Get("group")
	ls, more, busy, err := c.list(r.Context(), q, f)
	groups := groupLetters(ls)
	if group != "" {
		ls = slices.DeleteFunc(slices.Clone(ls), func(l *dlq.Letter) bool { return normalizeReason(l.Reason) != group })
	}
	rows := make([]letterView, len(ls))
	for i, l := range ls {
		rows[i] = c.view(l)
	}
	c.render(w, r, http.StatusOK, "queue", q.Name+" — dead letters — idemq console", map[string]any{
		"Queue": q, "Letters": rows, "Groups": groups, "More": more, "Busy": busy, "Running": c.running(q),
		"Error": c.errText(err), "Reason": f.Reason, "Key": f.Key, "Group": group, "Limit": listLimit,
		"Count": countString(len(ls), more),
	})
}

func (c *Console) letterPage(w http.ResponseWriter, r *http.Request, q *Queue) {
	id := r.URL.Query().Get("id")
	if id == "" {
		c.refuse(w, r, http.StatusBadRequest, "which dead letter? (id)")
		return
	}
	ls, _, busy, err := c.list(r.Context(), q, dlq.Filter{IDs: []string{id}})
	status := http.StatusOK
	var views []letterView
	for _, l := range ls {
		if l.ID == id || l.Key == id {
			views = append(views, c.view(l))
		}
	}
	if err == nil && !busy && len(views) == 0 {
		status = http.StatusNotFound
	}
	c.render(w, r, status, "letter", "Dead letter "+id+" — idemq console", map[string]any{
		"Queue": q, "ID": id, "Letters": views, "Busy": busy, "Error": c.errText(err),
	})
}

func (c *Console) outboxPage(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Outbox == nil {
		c.refuse(w, r, http.StatusNotFound, "no outbox is configured")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	st, err := c.cfg.Outbox.OutboxStats(ctx)
	if err != nil {
		c.log(ctx, slog.LevelWarn, "console: read the outbox", slog.String("error", c.errText(err)))
	}
	c.render(w, r, http.StatusOK, "outbox", "Outbox — idemq console", map[string]any{"Stats": st, "Error": c.errText(err)})
}

// dedupScope is a scope's row on the dedup page.
type dedupScope struct {
	Scope                     string
	Records, Expired          int64
	Oldest, Newest            time.Time
	Results, Failing          int64
	ResultsKnown, FailingKnow bool
	Claims                    *Claims
	Ages                      []ageView
}

type ageView struct {
	Name    string
	Records int64
}

func (c *Console) dedupPage(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Dedup == nil {
		c.refuse(w, r, http.StatusNotFound, "no dedup store is configured")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	st, err := c.cfg.Dedup.DedupStats(ctx)
	if err != nil {
		c.log(ctx, slog.LevelWarn, "console: read the dedup store", slog.String("error", c.errText(err)))
	}
	var rows []dedupScope
	var total int64
	for _, s := range st.Scopes {
		d := dedupScope{Scope: s.Scope, Records: s.Records, Expired: s.Expired, Oldest: s.Oldest, Newest: s.Newest}
		d.Results, d.ResultsKnown = st.Results[s.Scope], st.Results != nil
		d.Failing, d.FailingKnow = st.Failing[s.Scope], st.Failing != nil
		if cl, ok := st.Claims[s.Scope]; ok {
			d.Claims = &cl
		} else if st.Claims != nil {
			d.Claims = &Claims{}
		}
		for i := range s.Ages {
			d.Ages = append(d.Ages, ageView{Name: ageName(s.Ages, i), Records: s.Ages[i].Records})
		}
		rows = append(rows, d)
		total += s.Records
	}
	c.render(w, r, http.StatusOK, "dedup", "Dedup store — idemq console", map[string]any{
		"Stats": st, "Scopes": rows, "Total": total, "Error": c.errText(err), "ClaimsKnown": st.Claims != nil,
	})
}

// ageName names bucket i of ages: "<1m", "<1h", "<1d", "<7d", ">=7d".
func ageName(ages []dedup.AgeCount, i int) string {
	if u := ages[i].Under; u > 0 {
		return "<" + shortDuration(u)
	}
	if i == 0 {
		return "all"
	}
	return "≥" + shortDuration(ages[i-1].Under)
}

// shortDuration is d rounded for a page: "45s", "12m", "3h", "2d".
func shortDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}

func bytesString(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
