package console_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer/console"
	"github.com/idemq/idemq/consumer/dlq"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/internal/runtest"
)

// memStore is a dead-letter store in memory, shared by the brokers the
// console opens; a replay appends the letter's key to sent.
type memStore struct {
	mu      sync.Mutex
	letters []*dlq.Letter
	sent    []string
	openErr error
	// gate, when set, is received from before each replay: the test paces
	// a replay with it.
	gate chan struct{}
}

func (m *memStore) open(context.Context) (dlq.Broker, error) {
	if m.openErr != nil {
		return nil, m.openErr
	}
	return &memBroker{m}, nil
}

func (m *memStore) keys() (left, sent []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, l := range m.letters {
		left = append(left, l.Key)
	}
	return left, slices.Clone(m.sent)
}

type memBroker struct{ m *memStore }

func (b *memBroker) Scan(_ context.Context, visit func(*dlq.Letter) dlq.Action) (int, error) {
	b.m.mu.Lock()
	letters := slices.Clone(b.m.letters)
	b.m.mu.Unlock()
	done := 0
	var kept []*dlq.Letter
	for i, l := range letters {
		switch visit(l) {
		case dlq.ActionReplay:
			if b.m.gate != nil {
				<-b.m.gate
			}
			b.m.mu.Lock()
			b.m.sent = append(b.m.sent, l.Key)
			b.m.mu.Unlock()
			done++
		case dlq.ActionPurge:
			done++
		case dlq.ActionStop:
			kept = append(kept, letters[i:]...)
			b.set(kept)
			return done, nil
		default:
			kept = append(kept, l)
		}
	}
	b.set(kept)
	return done, nil
}

func (b *memBroker) set(ls []*dlq.Letter) {
	b.m.mu.Lock()
	b.m.letters = ls
	b.m.mu.Unlock()
}

func (b *memBroker) Close() error { return nil }

func newStore() *memStore {
	at := time.Now().Add(-time.Hour)
	return &memStore{letters: []*dlq.Letter{
		{ID: "1", Key: "order-1", Reason: `handler: bad SKU 17 in order "A-1"`, Origin: "orders", DeadLetteredAt: at, Body: []byte(`{"order":1}`), Size: 11, Headers: map[string]string{"tenant": "acme"}},
		{ID: "2", Key: "order-2", Reason: `handler: bad SKU 4 in order "B-7"`, Origin: "orders", DeadLetteredAt: at.Add(time.Minute), Body: []byte(`{"order":2}`), Size: 11},
		{ID: "3", Key: "order-3", Reason: "card declined", Origin: "orders", DeadLetteredAt: at.Add(2 * time.Minute), Body: []byte{0, 1, 2, 0xff, 'x'}, Size: 9000},
		{ID: "4", Key: "order-4", Reason: `handler: bad SKU 9 in order "C-2"`, Origin: "orders", DeadLetteredAt: at.Add(3 * time.Minute), Body: []byte(`{"order":4}`), Size: 11},
	}}
}

const token = "s3cret-console-token"

// site is a console served by httptest.
type site struct {
	t      *testing.T
	srv    *httptest.Server
	con    *console.Console
	logs   *runtest.SyncBuffer
	prefix string
}

func newSite(t *testing.T, c console.Config) *site {
	t.Helper()
	logs := &runtest.SyncBuffer{}
	c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	con, err := console.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { con.Close() })
	var h http.Handler = con
	if c.Prefix != "" {
		mux := http.NewServeMux()
		mux.Handle(c.Prefix+"/", con)
		h = mux
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &site{t: t, srv: srv, con: con, logs: logs, prefix: c.Prefix}
}

// client returns a browser: a cookie jar, no redirects followed.
func (s *site) client() *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func (s *site) do(c *http.Client, method, path string, form url.Values, hdr map[string]string) (int, string, http.Header) {
	s.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, s.srv.URL+s.prefix+path, body)
	if err != nil {
		s.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func (s *site) get(c *http.Client, path string) (int, string) {
	s.t.Helper()
	code, body, _ := s.do(c, http.MethodGet, path, nil, nil)
	return code, body
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf returns the CSRF token of the page at path, as the browser c gets it.
func (s *site) csrf(c *http.Client, path string) string {
	s.t.Helper()
	_, body := s.get(c, path)
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		s.t.Fatalf("no CSRF field on %s", path)
	}
	return m[1]
}

// signIn signs c in with tok and returns the CSRF token.
func (s *site) signIn(c *http.Client, tok string) (int, string) {
	s.t.Helper()
	csrf := s.csrf(c, "/login")
	code, _, _ := s.do(c, http.MethodPost, "/login", url.Values{"csrf": {csrf}, "token": {tok}, "next": {"/"}}, nil)
	return code, csrf
}

var planRE = regexp.MustCompile(`name="plan" value="([0-9a-f]+)"`)

// The console reads a dead-letter store as an operator needs it: counts,
// groups by normalised reason, a letter's metadata, headers and body, a
// binary body as hex and a long one marked truncated.
func TestConsolePages(t *testing.T) {
	st := newStore()
	s := newSite(t, console.Config{Queues: []console.Queue{{Name: "orders.dlq", Broker: "kafka", Open: st.open}}})
	c := s.client()

	code, body := s.get(c, "/")
	if code != http.StatusOK || !strings.Contains(body, "<title>idemq console — overview</title>") {
		t.Fatalf("overview: %d\n%s", code, body)
	}
	if !regexp.MustCompile(`data-queue="orders.dlq"[\s\S]*?class="num count"[^>]*>4<`).MatchString(body) {
		t.Errorf("overview does not count 4 dead letters:\n%s", body)
	}
	code, body = s.get(c, "/dlq/orders.dlq")
	if code != http.StatusOK {
		t.Fatalf("queue page: %d", code)
	}
	groups := regexp.MustCompile(`<tr class="group" data-reason="([^"]*)">[\s\S]*?class="num group-count" data-sort="(\d+)"`).FindAllStringSubmatch(body, -1)
	var got []string
	for _, g := range groups {
		got = append(got, g[1]+"="+g[2])
	}
	want := []string{"handler: bad SKU &lt;n&gt; in order &#34;…&#34;=3", "card declined=1"}
	if !slices.Equal(got, want) {
		t.Errorf("groups %q, want %q", got, want)
	}
	if strings.Contains(body, `id="replay-selected"`) {
		t.Error("a console without a token shows the replay button")
	}

	_, body = s.get(c, "/dlq/orders.dlq/letter?id=1")
	for _, w := range []string{`<dd class="meta-key">order-1</dd>`, `<td class="header-name">tenant</td><td class="header-value">acme</td>`, `<pre class="body" id="body-text">{&#34;order&#34;:1}</pre>`} {
		if !strings.Contains(body, w) {
			t.Errorf("letter 1 lacks %s:\n%s", w, body)
		}
	}
	_, body = s.get(c, "/dlq/orders.dlq/letter?id=3")
	if !strings.Contains(body, `id="body-hex"`) || !strings.Contains(body, "00 01 02 ff 78") || !strings.Contains(body, `id="body-truncated"`) {
		t.Errorf("binary, truncated letter 3 not shown as hex and truncated:\n%s", body)
	}
	if code, _ := s.get(c, "/dlq/orders.dlq/letter?id=nope"); code != http.StatusNotFound {
		t.Errorf("unknown letter: %d, want 404", code)
	}
	if code, _ := s.get(c, "/dlq/other"); code != http.StatusNotFound {
		t.Errorf("unknown queue: %d, want 404", code)
	}
}

// A group is replayed through a confirmation that says how many will move,
// then dlq.Replay, with progress; the other dead letters stay.
func TestConsoleReplayGroup(t *testing.T) {
	st := newStore()
	st.gate = make(chan struct{})
	s := newSite(t, console.Config{Token: token, Queues: []console.Queue{{Name: "orders.dlq", Broker: "kafka", Open: st.open}}})
	c := s.client()
	if code, _ := s.signIn(c, token); code != http.StatusSeeOther {
		t.Fatalf("sign in: %d", code)
	}
	csrf := s.csrf(c, "/dlq/orders.dlq")
	if _, body := s.get(c, "/dlq/orders.dlq"); !strings.Contains(body, `id="replay-selected"`) || !strings.Contains(body, `class="inline group-replay"`) {
		t.Errorf("signed in, the queue page offers no replay:\n%s", body)
	}
	group := `handler: bad SKU <n> in order "…"`
	code, body, _ := s.do(c, http.MethodPost, "/dlq/orders.dlq/confirm", url.Values{"csrf": {csrf}, "action": {"replay"}, "group": {group}}, nil)
	if code != http.StatusOK || !strings.Contains(body, `<span id="confirm-count">3</span>`) {
		t.Fatalf("confirm: %d\n%s", code, body)
	}
	if left, sent := st.keys(); len(left) != 4 || len(sent) != 0 {
		t.Fatalf("the confirmation changed the store: left %v, sent %v", left, sent)
	}
	plan := planRE.FindStringSubmatch(body)[1]
	code, _, hdr := s.do(c, http.MethodPost, "/dlq/orders.dlq/run", url.Values{"csrf": {csrf}, "plan": {plan}}, nil)
	if code != http.StatusSeeOther {
		t.Fatalf("run: %d", code)
	}
	jobPath := hdr.Get("Location")
	st.gate <- struct{}{}
	st.gate <- struct{}{}
	// Two of three replayed: the progress says so, and the queue page
	// does not scan while the replay runs.
	runtest.WaitFor(t, 10*time.Second, runtest.Say("progress 2 of 3"), func() bool {
		_, body := s.get(c, strings.TrimPrefix(jobPath, s.prefix)+"/progress.json")
		return strings.Contains(body, `"done":2`) && strings.Contains(body, `"running":true`)
	})
	if _, body := s.get(c, "/dlq/orders.dlq"); !strings.Contains(body, `id="queue-busy"`) {
		t.Error("the queue page does not say a replay is running")
	}
	if _, body := s.get(c, strings.TrimPrefix(jobPath, s.prefix)); !strings.Contains(body, `http-equiv="refresh"`) || !strings.Contains(body, `<span id="job-done">2</span> of <span id="job-total">3</span>`) {
		t.Errorf("the job page of a running replay:\n%s", body)
	}
	st.gate <- struct{}{}
	runtest.WaitFor(t, 10*time.Second, runtest.Say("the replay to end"), func() bool {
		_, body := s.get(c, strings.TrimPrefix(jobPath, s.prefix)+"/progress.json")
		return strings.Contains(body, `"running":false`)
	})
	left, sent := st.keys()
	slices.Sort(sent)
	if !slices.Equal(left, []string{"order-3"}) || !slices.Equal(sent, []string{"order-1", "order-2", "order-4"}) {
		t.Errorf("after the group's replay: left %v, sent %v", left, sent)
	}
	// A plan runs once.
	if code, _, _ := s.do(c, http.MethodPost, "/dlq/orders.dlq/run", url.Values{"csrf": {csrf}, "plan": {plan}}, nil); code != http.StatusBadRequest {
		t.Errorf("a plan run twice: %d, want 400", code)
	}
	if !strings.Contains(s.logs.String(), "console: replay ended") {
		t.Errorf("no log line for the replay:\n%s", s.logs.String())
	}
}

// Each attack on the handler, from outside, is refused, and the store is
// left as it was.
func TestConsoleSecurity(t *testing.T) {
	mutate := func(t *testing.T, s *site, c *http.Client, csrf string, hdr map[string]string) int {
		t.Helper()
		code, _, _ := s.do(c, http.MethodPost, "/dlq/orders.dlq/confirm", url.Values{"csrf": {csrf}, "action": {"purge"}, "all": {"1"}}, hdr)
		return code
	}
	unchanged := func(t *testing.T, st *memStore) {
		t.Helper()
		if left, _ := st.keys(); len(left) != 4 {
			t.Errorf("the store changed: %v", left)
		}
	}

	t.Run("no token", func(t *testing.T) {
		st := newStore()
		s := newSite(t, console.Config{Token: token, Queues: []console.Queue{{Name: "orders.dlq", Open: st.open}}})
		c := s.client()
		if _, body := s.get(c, "/dlq/orders.dlq"); strings.Contains(body, `id="replay-selected"`) || !strings.Contains(body, `id="sign-in-hint"`) {
			t.Errorf("the queue page offers a replay before signing in, or no way to sign in:\n%s", body)
		}
		csrf := s.csrf(c, "/login")
		if code := mutate(t, s, c, csrf, nil); code != http.StatusUnauthorized {
			t.Errorf("confirm without signing in: %d, want 401", code)
		}
		if code, _, _ := s.do(c, http.MethodPost, "/dlq/orders.dlq/run", url.Values{"csrf": {csrf}, "plan": {"x"}}, nil); code != http.StatusUnauthorized {
			t.Errorf("run without signing in: %d, want 401", code)
		}
		unchanged(t, st)
	})

	t.Run("wrong token", func(t *testing.T) {
		st := newStore()
		s := newSite(t, console.Config{Token: token, Queues: []console.Queue{{Name: "orders.dlq", Open: st.open}}})
		c := s.client()
		if code, _ := s.signIn(c, token+"x"); code != http.StatusUnauthorized {
			t.Errorf("sign in with a wrong token: %d, want 401", code)
		}
		csrf := s.csrf(c, "/login")
		if code := mutate(t, s, c, csrf, nil); code != http.StatusUnauthorized {
			t.Errorf("confirm after a failed sign-in: %d, want 401", code)
		}
		for _, bad := range []string{"Bearer " + token[:len(token)-1], "Bearer ", "Basic " + token} {
			if code := mutate(t, s, s.client(), "", map[string]string{"Authorization": bad}); code != http.StatusUnauthorized {
				t.Errorf("Authorization %q: %d, want 401", bad, code)
			}
		}
		// A forged session cookie.
		u, _ := url.Parse(s.srv.URL)
		f := s.client()
		f.Jar.SetCookies(u, []*http.Cookie{{Name: "idemq_console_session", Value: "AAAA"}})
		if code := mutate(t, s, f, s.csrf(f, "/login"), nil); code != http.StatusUnauthorized {
			t.Errorf("forged session cookie: %d, want 401", code)
		}
		unchanged(t, st)
		if strings.Contains(s.logs.String(), token) {
			t.Errorf("the token is in the log:\n%s", s.logs.String())
		}
	})

	t.Run("cross-site POST", func(t *testing.T) {
		st := newStore()
		s := newSite(t, console.Config{Token: token, Queues: []console.Queue{{Name: "orders.dlq", Open: st.open}}})
		c := s.client()
		_, csrf := s.signIn(c, token)
		for _, hdr := range []map[string]string{
			{"Sec-Fetch-Site": "cross-site"},
			{"Origin": "https://evil.example"},
		} {
			if code := mutate(t, s, c, csrf, hdr); code != http.StatusForbidden {
				t.Errorf("signed in, cross-site %v: %d, want 403", hdr, code)
			}
		}
		// A forged form: the session cookie rides along, the CSRF token
		// cannot be known.
		if code := mutate(t, s, c, "", nil); code != http.StatusForbidden {
			t.Errorf("signed in, no CSRF field: %d, want 403", code)
		}
		if code := mutate(t, s, c, strings.Repeat("A", 43), nil); code != http.StatusForbidden {
			t.Errorf("signed in, wrong CSRF field: %d, want 403", code)
		}
		// A cross-site sign-in (login CSRF) is refused too.
		if code, _, _ := s.do(s.client(), http.MethodPost, "/login", url.Values{"token": {token}}, map[string]string{"Sec-Fetch-Site": "cross-site"}); code != http.StatusForbidden {
			t.Errorf("cross-site sign-in: %d, want 403", code)
		}
		unchanged(t, st)
		// The same browser, same site, with the CSRF token: accepted.
		if code := mutate(t, s, c, csrf, map[string]string{"Sec-Fetch-Site": "same-origin"}); code != http.StatusOK {
			t.Errorf("signed in, same origin, with the CSRF token: %d, want 200", code)
		}
	})

	t.Run("asset path traversal", func(t *testing.T) {
		s := newSite(t, console.Config{})
		if code, body := s.get(s.client(), "/static/console.css"); code != http.StatusOK || !strings.Contains(body, "idemq console") {
			t.Fatalf("console.css: %d", code)
		}
		for _, p := range []string{
			"/static/../console.go", "/static/..%2fconsole.go", "/static/%2e%2e/console.go", "/static/../../go.mod",
			"/static/..%2f..%2fconsole.go", "/static/templates/layout.html", "/static/../templates/layout.html",
			"/static/%2e%2e%2ftemplates%2flayout.html", "/static//etc/passwd", "/static/..\\console.go", "/static/",
		} {
			req, _ := http.NewRequest(http.MethodGet, s.srv.URL+p, nil)
			req.URL.RawPath, req.URL.Path = "", "" // sent as written
			req.URL.Opaque = "//" + req.URL.Host + p
			resp, err := s.client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), `href="console.js"`) {
				t.Errorf("GET %s (%d) lists the assets", p, resp.StatusCode)
			}
			if strings.Contains(string(b), "package console") || strings.Contains(string(b), "{{define") || strings.Contains(string(b), "module github.com") || strings.Contains(string(b), "root:") {
				t.Errorf("GET %s (%d) served a file outside the assets", p, resp.StatusCode)
			}
		}
	})

	t.Run("stored XSS", func(t *testing.T) {
		st := &memStore{letters: []*dlq.Letter{{
			ID: "x1", Key: `k"><script>alert('key')</script>`, Reason: `<img src=x onerror=alert(1)> failed`,
			Origin: "orders", Body: []byte(`<script>alert("body")</script>`), Size: 30,
			Headers: map[string]string{`h"><script>alert(2)</script>`: `<svg onload=alert(3)>`, "Authorization": "Bearer abc"},
		}}}
		s := newSite(t, console.Config{Token: token, Queues: []console.Queue{{Name: "orders.dlq", Open: st.open}}})
		c := s.client()
		s.signIn(c, token)
		_, queue := s.get(c, "/dlq/orders.dlq")
		_, letter := s.get(c, "/dlq/orders.dlq/letter?id=x1")
		code, confirm, hdr := s.do(c, http.MethodPost, "/dlq/orders.dlq/confirm", url.Values{"csrf": {s.csrf(c, "/login")}, "action": {"replay"}, "id": {"x1"}}, nil)
		if code != http.StatusOK {
			t.Fatalf("confirm: %d", code)
		}
		for name, page := range map[string]string{"queue": queue, "letter": letter, "confirm": confirm} {
			for _, raw := range []string{"<script>alert", "<img src=x", "<svg onload", "onerror=alert(1)>"} {
				if strings.Contains(page, raw) {
					t.Errorf("the %s page holds %q unescaped", name, raw)
				}
			}
		}
		for _, esc := range []string{"&lt;script&gt;alert(&#34;body&#34;)&lt;/script&gt;", "&lt;img src=x onerror=alert(1)&gt; failed", "&lt;svg onload=alert(3)&gt;"} {
			if !strings.Contains(letter, esc) {
				t.Errorf("the letter page does not show %q as text", esc)
			}
		}
		if strings.Contains(letter, "Bearer abc") {
			t.Error("the letter page shows an Authorization header's value")
		}
		if csp := hdr.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
			t.Errorf("Content-Security-Policy %q", csp)
		}
	})

	t.Run("DSN password", func(t *testing.T) {
		const dsn = "postgres://ops:hunter2pw@db.internal:5432/orders?sslpassword=keyphrase9"
		st := newStore()
		st.openErr = fmt.Errorf("connect to %s: refused", dsn)
		s := newSite(t, console.Config{
			Token: token, DSNs: []string{dsn},
			Queues:  []console.Queue{{Name: "orders.dlq", Open: st.open}},
			Outbox:  failingOutbox{fmt.Errorf("read idemq_outbox: %s: password authentication failed for hunter2pw", dsn)},
			Dedup:   failingDedup{errors.New("dial " + dsn)},
			Workers: []console.Worker{{Name: "w1", URL: "http://ops:hunter2pw@127.0.0.1:1/health/readyz?token=keyphrase9"}},
		})
		c := s.client()
		var pages []string
		for _, p := range []string{"/", "/overview.json", "/dlq/orders.dlq", "/dlq/orders.dlq/letter?id=1", "/outbox", "/dedup", "/workers", "/workers.json"} {
			_, body := s.get(c, p)
			pages = append(pages, body)
		}
		s.signIn(c, token)
		_, confirm, _ := s.do(c, http.MethodPost, "/dlq/orders.dlq/confirm", url.Values{"csrf": {s.csrf(c, "/login")}, "action": {"replay"}, "all": {"1"}}, nil)
		pages = append(pages, confirm)
		all := strings.Join(pages, "\n")
		if !strings.Contains(all, "db.internal") {
			t.Errorf("the pages do not show the store's error at all:\n%s", all)
		}
		for _, secret := range []string{"hunter2pw", "keyphrase9", token} {
			if strings.Contains(all, secret) {
				t.Errorf("a page shows %q", secret)
			}
			if strings.Contains(s.logs.String(), secret) {
				t.Errorf("the log shows %q:\n%s", secret, s.logs.String())
			}
		}
		if !strings.Contains(s.logs.String(), "db.internal") {
			t.Errorf("the failures are not logged:\n%s", s.logs.String())
		}
	})

	t.Run("read-only", func(t *testing.T) {
		st := newStore()
		s := newSite(t, console.Config{Token: token, ReadOnly: true, Queues: []console.Queue{{Name: "orders.dlq", Open: st.open}}})
		c := s.client()
		if code, _ := s.signIn(c, token); code != http.StatusForbidden {
			t.Errorf("sign in to a read-only console: %d, want 403", code)
		}
		csrf := s.csrf(c, "/login")
		if code := mutate(t, s, c, csrf, map[string]string{"Authorization": "Bearer " + token}); code != http.StatusForbidden {
			t.Errorf("mutation with the right token, read-only: %d, want 403", code)
		}
		_, body := s.get(c, "/dlq/orders.dlq")
		if strings.Contains(body, "Replay") || !strings.Contains(body, `id="mode-readonly"`) {
			t.Errorf("a read-only queue page offers a replay or does not say read-only:\n%s", body)
		}
		unchanged(t, st)
	})

	t.Run("prefix mounting", func(t *testing.T) {
		st := newStore()
		s := newSite(t, console.Config{Token: token, Prefix: "/ops/idemq", Queues: []console.Queue{{Name: "orders.dlq", Open: st.open}}})
		c := s.client()
		code, body := s.get(c, "/")
		if code != http.StatusOK {
			t.Fatalf("GET /ops/idemq/: %d", code)
		}
		for _, href := range regexp.MustCompile(`(?:href|action|src)="([^"]*)"`).FindAllStringSubmatch(body, -1) {
			if !strings.HasPrefix(href[1], "/ops/idemq/") {
				t.Errorf("link %q is outside the prefix", href[1])
			}
		}
		if code, _ := s.get(c, "/static/console.js"); code != http.StatusOK {
			t.Errorf("GET /ops/idemq/static/console.js: %d", code)
		}
		csrf := s.csrf(c, "/login")
		code, _, hdr := s.do(c, http.MethodPost, "/login", url.Values{"csrf": {csrf}, "token": {token}, "next": {"/dlq/orders.dlq"}}, nil)
		if code != http.StatusSeeOther || hdr.Get("Location") != "/ops/idemq/dlq/orders.dlq" {
			t.Errorf("sign in: %d to %q", code, hdr.Get("Location"))
		}
		if ck := hdr.Values("Set-Cookie"); len(ck) == 0 || !strings.Contains(ck[0], "Path=/ops/idemq/") || !strings.Contains(ck[0], "HttpOnly") || !strings.Contains(ck[0], "SameSite=Strict") {
			t.Errorf("session cookie %q", ck)
		}
		// A reverse proxy that strips the prefix reaches the same pages.
		direct := httptest.NewServer(s.con)
		defer direct.Close()
		resp, err := http.Get(direct.URL + "/dlq/orders.dlq")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `href="/ops/idemq/static/console.css"`) {
			t.Errorf("a request the proxy stripped: %d", resp.StatusCode)
		}
		// An open redirect through next is refused.
		code, _, hdr = s.do(s.client(), http.MethodPost, "/login", url.Values{"csrf": {csrf}, "token": {token}, "next": {"//evil.example/"}}, map[string]string{"Cookie": "idemq_console_csrf=" + csrf})
		if code != http.StatusSeeOther || hdr.Get("Location") != "/ops/idemq/" {
			t.Errorf("sign in with next=//evil.example/: %d to %q", code, hdr.Get("Location"))
		}
	})
}

type failingOutbox struct{ err error }

func (f failingOutbox) OutboxStats(context.Context) (console.OutboxStats, error) {
	return console.OutboxStats{}, f.err
}

type failingDedup struct{ err error }

func (f failingDedup) DedupStats(context.Context) (console.DedupStats, error) {
	return console.DedupStats{}, f.err
}

type fixedOutbox console.OutboxStats

func (f fixedOutbox) OutboxStats(context.Context) (console.OutboxStats, error) {
	return console.OutboxStats(f), nil
}

type fixedDedup console.DedupStats

func (f fixedDedup) DedupStats(context.Context) (console.DedupStats, error) {
	return console.DedupStats(f), nil
}

// The outbox and dedup pages show what their readers report, and say
// plainly what a store does not report.
func TestConsoleOutboxAndDedup(t *testing.T) {
	now := time.Now()
	ob := fixedOutbox{Table: "public.idemq_outbox", Pending: 42, Failing: 3, Parked: 1, Sent: 900, OldestPending: 95 * time.Second, OldestParked: 3 * time.Hour, SentLastMinute: 120}
	rep := dedup.TableReport{At: now, Table: "public.processed_messages", Scopes: []dedup.ScopeReport{{
		ScopeStats: dedup.ScopeStats{Scope: "orders", Records: 1234, Oldest: now.Add(-50 * time.Hour)}, Newest: now, Expired: 7,
		Ages: []dedup.AgeCount{{Under: time.Minute, Records: 4}, {Under: 0, Records: 1230}},
	}}}
	s := newSite(t, console.Config{Outbox: ob, Dedup: fixedDedup{TableReport: rep, Retention: 192 * time.Hour,
		Results: map[string]int64{"orders": 12}, Failing: map[string]int64{"orders": 2}}})
	c := s.client()
	_, body := s.get(c, "/outbox")
	for _, w := range []string{`id="outbox-pending">42<`, `id="outbox-oldest-pending">1m<`, `id="outbox-sent-per-minute">120<`, `id="outbox-parked" class="bad">1 (oldest 3h)<`, `id="outbox-failing">3<`} {
		if !strings.Contains(body, w) {
			t.Errorf("outbox page lacks %s:\n%s", w, body)
		}
	}
	_, body = s.get(c, "/dedup")
	for _, w := range []string{`id="dedup-retention">8d<`, `<td class="num records">1234</td>`, `<td class="num results">12</td>`, `<td class="num failing">2</td>`, `<td class="num claims">—</td>`, `id="claims-note"`, `id="no-partitions"`, `<th class="num">&lt;1m</th>`} {
		if !strings.Contains(body, w) {
			t.Errorf("dedup page lacks %s:\n%s", w, body)
		}
	}
	s2 := newSite(t, console.Config{Dedup: fixedDedup{TableReport: rep, Claims: map[string]console.Claims{"orders": {Count: 3, Oldest: now.Add(-2 * time.Minute)}},
		Partitions: []console.Partition{{Name: "processed_messages_p20260101", Bound: "FOR VALUES FROM ('2026-01-01') TO ('2026-01-02')", Rows: 500, Bytes: 1 << 20}}}})
	_, body = s2.get(s2.client(), "/dedup")
	for _, w := range []string{`<td class="num claims">3</td>`, `<td class="claim-age">2m ago</td>`, `data-partition="processed_messages_p20260101"`, "1.0 MiB"} {
		if !strings.Contains(body, w) {
			t.Errorf("dedup page with claims and partitions lacks %s:\n%s", w, body)
		}
	}
	// The transactions claiming now, some of whose start the reader may
	// not see; and an empty table, which has no scope to head the ages.
	s3 := newSite(t, console.Config{Dedup: fixedDedup{TableReport: dedup.TableReport{At: now}, Claiming: &console.Claiming{Transactions: 3, Hidden: 2, Oldest: now.Add(-4 * time.Minute)}}})
	_, body = s3.get(s3.client(), "/dedup")
	for _, w := range []string{`id="dedup-claiming">3<`, `id="dedup-claiming-age">4m ago<`, `id="claiming-hidden">2 of the transactions`, `id="dedup-scope-count">0<`} {
		if !strings.Contains(body, w) {
			t.Errorf("dedup page with transactions claiming lacks %s:\n%s", w, body)
		}
	}
}

// New refuses a configuration it cannot serve.
func TestConsoleConfig(t *testing.T) {
	open := func(context.Context) (dlq.Broker, error) { return nil, nil }
	for _, c := range []console.Config{
		{Queues: []console.Queue{{Name: "a/b", Open: open}}},
		{Queues: []console.Queue{{Name: "a", Open: open}, {Name: "a", Open: open}}},
		{Queues: []console.Queue{{Name: "a"}}},
		{Workers: []console.Worker{{Name: "w", URL: "file:///etc/passwd"}}},
		{Workers: []console.Worker{{Name: "", URL: "http://127.0.0.1/readyz"}}},
		{Prefix: "idemq"},
		{Prefix: "/idemq/"},
	} {
		if _, err := console.New(c); err == nil {
			t.Errorf("New(%+v) = nil error", c)
		}
	}
}
